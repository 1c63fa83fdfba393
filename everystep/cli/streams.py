"""``everystep stream RUN [KEY]``: a run's streams, or one stream's values
as JSON lines, as they come with ``--follow``."""

from __future__ import annotations

import argparse
import json
import sys

from .. import serde, stream_reader, streams
from ..cliutil import count, format_table
from ..store import Store
from .command import Command, add_run_argument


def _arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser)
    parser.add_argument("key", metavar="KEY", nargs="?", default=None,
                        help="the stream to print (default: list the run's streams)")
    parser.add_argument("--follow", "-f", action="store_true",
                        help="wait for more values until the stream is closed or the run ends")
    parser.add_argument("--after", type=count(0, 2**62), default=0, metavar="N",
                        help="start after the N-th value (a reader resuming; default: from the first)")


def cmd_stream(store: Store, args: argparse.Namespace) -> int:
    run = store.find_run(args.run_id)
    if args.key is None:
        rows = [(summary.key, summary.last_seq, "closed" if summary.closed else "open")
                for summary in store.streams_of(run.id)]
        print(format_table(("KEY", "LAST", "STATE"), rows) if rows else f"run {run.id} has written no stream")
        return 0
    key = streams.key_checked(args.key, "stream")
    reader = stream_reader.StreamReader(store, run.id, key, args.after)
    if args.follow:
        for item in reader.open().items():
            _print(item.value)
        return 0
    while True:  # what is there now, without waiting
        batch = store.stream_items(run.id, key, reader.last_seq, stream_reader.BATCH)
        for item in batch:
            if item.closed:
                return 0
            _print(item.value)
            reader.last_seq = item.seq
        if len(batch) < stream_reader.BATCH:
            return 0


def _print(value: object) -> None:
    sys.stdout.write(json.dumps(serde.to_jsonable(value), separators=(",", ":")) + "\n")
    sys.stdout.flush()


STREAM = Command(
    "stream", "print a run's stream, as JSON lines (--follow: as they come)",
    "Print the values run RUN wrote to its stream KEY (everystep.write_stream), one JSON document a line, "
    "in order; with --follow, wait for more until the stream is closed or the run ends. Without KEY, list the "
    "run's streams.",
    cmd_stream, _arguments, read_only=True)

__all__ = ["STREAM", "cmd_stream"]
