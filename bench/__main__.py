"""``python -m bench [--quick] [--database URL] [--out DIR]``: see ``bench.runner``."""

import sys
from pathlib import Path

# The harness imports tests.support.pgserver and starts runners with
# ``--app bench.workloads``: both need the repository root importable.
ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.runner import main  # noqa: E402

sys.exit(main())
