"""An app module whose import takes as long as a test wants: importing it
writes ``<EVERYSTEP_TEST_IMPORT_GATE>.importing``, then waits (two minutes
at most) until the file ``EVERYSTEP_TEST_IMPORT_GATE`` exists. A big
application's import, held still while a test signals the supervisor."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.waiting import wait_for_file

GATE_ENV = "EVERYSTEP_TEST_IMPORT_GATE"

_gate = Path(os.environ[GATE_ENV])
_gate.with_suffix(".importing").write_text(str(os.getpid()))
wait_for_file(_gate, timeout=120)
