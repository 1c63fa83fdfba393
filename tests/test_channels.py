"""Each NOTIFY channel is named once (``everystep.store.channels``): the SQL
renders it from a placeholder, so a statement that spells a channel out
could drift from what the listeners compare against."""

from __future__ import annotations

from pathlib import Path

from everystep.store import channels, queries

QUERY_FILES = sorted((Path(__file__).resolve().parent.parent / "everystep" / "store" / "queries").glob("*.sql"))


def test_no_statement_spells_a_channel_out() -> None:
    for path in QUERY_FILES:
        code = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                         if not line.lstrip().startswith("--"))
        for channel in channels.PLACEHOLDERS.values():
            for spelled in (f"'{channel}'", f"LISTEN {channel}"):
                assert spelled not in code, f"{path.name} spells {spelled}: use its placeholder"


def test_a_runner_listens_on_every_channel_the_statements_notify() -> None:
    """Runners listen on every channel but the streams' (only stream readers
    listen to that one: a value written wakes no runner)."""
    statements = queries.load("postgres")
    listened = {line.split()[1].rstrip(";") for name in ("listen", "listen_streams")
                for line in statements[name].splitlines() if line.startswith("LISTEN")}
    assert listened == set(channels.PLACEHOLDERS.values())
    assert channels.STREAM_CHANNEL not in statements["listen"]
    notified = {channel for channel in channels.PLACEHOLDERS.values()
                if any(f"pg_notify('{channel}'" in text for text in statements.values())}
    assert notified == listened
