"""What a child is doing right now, in memory shared with the parent.

Telling the parent about every step over the channel costs a message, a
wake-up of the parent and a parse, twice per step, for information the
parent only needs when an operator asks (``ctl status``, ``ctl kill``). So a
child publishes its steps in flight on a small anonymous shared mapping,
created by the parent before the fork, and the parent reads it on demand.
Only steps with a timeout are also announced by message, because the parent
must know their deadlines as they start.

The mapping is a seqlock: the writer bumps a counter to odd, writes, bumps
it to even; a reader retries until it sees the same even counter before and
after copying, so it never parses a half-written record.
"""

from __future__ import annotations

import json
import mmap
import struct
from typing import Any

SIZE = 16 * 1024
_HEADER = struct.Struct("=QI")  # sequence, payload length


class StepBoard:
    def __init__(self) -> None:
        self._map = mmap.mmap(-1, SIZE)  # anonymous and MAP_SHARED: survives fork()
        _HEADER.pack_into(self._map, 0, 0, 0)

    def publish(self, steps: list[bytes]) -> None:
        """Child side: replace the steps in flight (one writer per board),
        each already encoded by ``encode_step``: a child encodes a step once
        as it starts, not on every change of the board."""
        data = b"[" + b",".join(steps) + b"]"
        while len(data) > SIZE - _HEADER.size and steps:
            steps = steps[:-1]  # keep the oldest steps; the board is a view, not a log
            data = b"[" + b",".join(steps) + b"]"
        sequence = _HEADER.unpack_from(self._map, 0)[0]
        _HEADER.pack_into(self._map, 0, sequence + 1, len(data))  # odd: being written
        self._map[_HEADER.size:_HEADER.size + len(data)] = data
        struct.pack_into("=Q", self._map, 0, sequence + 2)

    def read(self) -> list[dict[str, Any]]:
        """Parent side: the steps in flight (empty if the board keeps changing
        under us, which only a child racing through tiny steps can cause)."""
        for _ in range(1000):
            before, length = _HEADER.unpack_from(self._map, 0)
            if before & 1:
                continue
            data = self._map[_HEADER.size:_HEADER.size + min(length, SIZE - _HEADER.size)]
            if struct.unpack_from("=Q", self._map, 0)[0] != before:
                continue
            try:
                steps = json.loads(data) if data else []
            except ValueError:
                continue
            return steps if isinstance(steps, list) else []
        return []

    def close(self) -> None:
        self._map.close()


def encode_step(step: dict[str, Any]) -> bytes:
    return _ENCODER.encode(step).encode()


_ENCODER = json.JSONEncoder(separators=(",", ":"))
