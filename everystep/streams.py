"""Stream writes: values out of a running run, as they happen.

A run writes values under a key (``everystep.write_stream``); anyone reads
them in order as they come (``everystep.read_stream``, the console's
``GET /api/runs/<id>/streams/<key>``). The rows and their order are the
store's (``store/base/streams.py``). What a reader sees is exactly once,
by one rule per writer:

- **From a body, a write is a recorded step.** The value's row and the
  step's record commit in one transaction (``body_calls.record_write``); a
  replay finds the step and writes nothing again. A crash before the
  commit writes neither; the replay writes the value then.
- **From a step's code, a write is part of that step's attempt.** It
  commits at once, in a batch with the values written while the previous
  batch committed (``stream_batches``: a long step shows its progress
  live, and a step's values are all committed before its outcome is
  recorded), tagged with the
  step and the id of the execution running it (its ``attempt``: a
  supervisor's next child, even under the same claim, is a new one). If that attempt
  never records (its process was killed, the runner lost the run), the
  step runs again in a later execution, and that execution's first write
  of the step withdraws every earlier execution's values of it, in the
  same transaction. So a reader that starts after the retry began sees
  the retry's values only, never a half-attempt's beside them. A reader
  that already read some values of the dead attempt keeps them (seqs only
  grow: it is not sent them again, nor told of the withdrawal, except by
  ``read_stream(..., items=True)``, whose items carry the step and attempt,
  so it can tell the retry's values from the first attempt's). An
  attempt that failed with its exception recorded (a retry policy's
  ``retrying``, or ``failed``) keeps its values the same way until its
  next attempt writes. Values written before a step's code raised stay
  as they are when the step's failure is final.

A stream ends when it is closed (``close_stream``: a closing marker, a
recorded step from a body) or when its run ends (no longer scheduled,
running or blocked): readers stop there; a write after a close is refused.

Bounds: one value's JSON at most ``EVERYSTEP_STREAM_MAX_VALUE_BYTES``
bytes (default 65,536), one stream at most ``EVERYSTEP_STREAM_MAX_VALUES``
values (default 100,000); past either, ``StreamRefused`` and nothing is
written. Values are JSON as step results are; one that is not refuses the
write (``EverystepError``, one line) before anything is written.

Fault injection: ``runner.fault`` is called ``(ctx, step_id)`` just before
a body's write's transaction (a crash there writes nothing).
"""

from __future__ import annotations

import os

from . import body_calls, serde, stream_batches
from .context import IN_STEP, Context, current, recording_context
from .errors import EverystepError, StreamRefused
from .store import StreamBounds

WRITE_STEP = "everystep.write_stream"
CLOSE_STEP = "everystep.close_stream"

#: The environment variables that bound a stream, and their defaults.
MAX_VALUE_BYTES_ENV = "EVERYSTEP_STREAM_MAX_VALUE_BYTES"
MAX_VALUES_ENV = "EVERYSTEP_STREAM_MAX_VALUES"
DEFAULT_MAX_VALUE_BYTES = 65_536
DEFAULT_MAX_VALUES = 100_000
#: A key's longest length (MariaDB's column is VARCHAR(255)).
MAX_KEY_LENGTH = 255


def bounds() -> StreamBounds:
    """The bounds in force, read from the environment on each write (so a
    deployment sets them without code)."""
    return StreamBounds(_positive(MAX_VALUE_BYTES_ENV, DEFAULT_MAX_VALUE_BYTES),
                        _positive(MAX_VALUES_ENV, DEFAULT_MAX_VALUES))


def _positive(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise EverystepError(f"{name} must be a whole number of 1 or more, not {text!r}")
    return value


def key_checked(key: object, call: str) -> str:
    """A stream's key, refused (one line) unless a non-empty string of at
    most ``MAX_KEY_LENGTH`` characters."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise EverystepError(f"{call} needs a key, a non-empty string of at most {MAX_KEY_LENGTH} characters, "
                             f"not {key!r}"[:300])
    return key


def value_json(key: str, value: object, limits: StreamBounds) -> str:
    """``value`` as JSON, refused before anything is written when it is
    not JSON (``EverystepError``) or past the bound of one value."""
    text = serde.dumps(value, f"value of stream {key!r}")
    size = len(text.encode("utf-8"))
    if size > limits.value_bytes:
        raise StreamRefused(f"a value of {size} bytes for stream {key!r} is past the bound of {limits.value_bytes} "
                            f"bytes ({MAX_VALUE_BYTES_ENV}); nothing was written")
    return text


def write(key: str, value: object, everystep_id: str | None) -> int | None:
    """See ``everystep.write_stream``: the value's seq (None from a step's
    code: the value is queued)."""
    key_checked(key, "write_stream")
    limits = bounds()
    ctx = recording_context()
    if ctx is not None:
        text = _checked_in_body(ctx, key, value, limits)
        return _recorded(ctx, WRITE_STEP, key, text, limits, everystep_id, [key, value])
    _from_step("write_stream", key, value_json(key, value, limits), limits)
    return None


def close(key: str, everystep_id: str | None) -> int | None:
    """See ``everystep.close_stream``: the closing marker's seq (None from
    a step's code)."""
    key_checked(key, "close_stream")
    limits = bounds()
    ctx = recording_context()
    if ctx is not None:
        return _recorded(ctx, CLOSE_STEP, key, None, limits, everystep_id, [key])
    _from_step("close_stream", key, None, limits)
    return None


def _checked_in_body(ctx: Context, key: str, value: object, limits: StreamBounds) -> str:
    """A body's value as JSON: one that is not JSON ends the run (as an
    unstorable argument does: the same body would fail the same way on
    every replay); one past the bound raises ``StreamRefused`` where it
    was written, which the body may catch (the check is the same on every
    replay, so nothing needs recording)."""
    try:
        return value_json(key, value, limits)
    except StreamRefused:
        raise
    except EverystepError as exc:
        raise ctx.execution.interrupt_with(exc) from None


def _recorded(ctx: Context, step_name: str, key: str, text: str | None, limits: StreamBounds,
              everystep_id: str | None, args: list[object]) -> int:
    """A body's write or close as a recorded step whose result is the seq."""
    return int(body_calls.record_write(
        ctx, step_name, args, everystep_id,
        lambda ex, entry, markers: ex.store.record_stream_write(ex.claim, entry, key, text, limits, markers)))


def _from_step(call: str, key: str, text: str | None, limits: StreamBounds) -> None:
    """A write from a step's own code: part of that step's attempt (see the
    module), queued for its execution's writer (``stream_batches``).
    Outside any workflow there is no stream to write to."""
    step_id = IN_STEP.get()
    ctx = current()
    if step_id is None or ctx is None:
        raise EverystepError(f"everystep.{call} is called from a workflow body or a step's code, where a run "
                             "is running; outside one, there is no run to write to")
    stream_batches.of(ctx.execution).put(step_id, key, text, limits)


__all__ = ["CLOSE_STEP", "DEFAULT_MAX_VALUES", "DEFAULT_MAX_VALUE_BYTES", "MAX_KEY_LENGTH", "MAX_VALUES_ENV",
           "MAX_VALUE_BYTES_ENV", "WRITE_STEP", "bounds", "close", "key_checked", "value_json", "write"]
