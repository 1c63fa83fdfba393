"""``python -m everystep.cli``: the ``everystep`` command."""

from . import main

if __name__ == "__main__":
    raise SystemExit(main())
