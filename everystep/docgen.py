"""The reference pages' generated parts, rendered from the code itself.

The documentation site's hook (``docs/hooks/reference.py``) replaces each
``<!-- generated: NAME -->`` placeholder with ``GENERATED[NAME]()``, so the
reference of the command line, the metrics, the statuses, the exit codes,
the environment and the tables is read from the parsers, the metrics
registry, the enums and the migrated schema at build time and cannot drift
from them. The tests (``tests/test_docs.py``) use the same functions.

The supervisor's parts (its command line, the control socket) are rendered
by ``supervisor.docgen``, which extends ``GENERATED``: the library never
imports the supervisor.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import everystep

from . import cliutil, history_bound, metrics, streams, wait_kinds
from .body_rules import BodyRule, declaration_of
from .cli import build_parser
from .store import connect
from .vocabulary import INVALID_COMMAND
from .models import (
    ACTIVE_STATUSES, CANCELLABLE_STATUSES, EXECUTION_ENDS, PRUNABLE_STATUSES, STEP_OPEN_STATUSES, STEP_WAITING_STATUSES,
    TERMINAL_STATUSES, WAITING, RequestStatus, RunStatus, Status, StepStatus,
)

# -- text ----------------------------------------------------------------------


def text(value: object) -> str:
    """Plain text made safe for Markdown: help strings use ``*``, ``<`` and
    ``|`` literally (``N|none``, ``*`` for several)."""
    out = str(value).replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;").replace("|", "&#124;")
    return out.replace("`", "\\`").replace("[", "\\[").replace("_", "\\_")


def code(value: object) -> str:
    """An inline code span (a backtick inside gets a longer fence)."""
    value = str(value)
    fence = "``" if "`" in value else "`"
    return f"{fence}{value}{fence}" if value else "``"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; cells are Markdown already (pipes escaped)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "&#124;") if "`" not in cell else cell for cell in row) + " |"
              for row in rows]
    return "\n".join(lines)


# -- command lines -------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, one-line summary) of each subcommand of ``parser``, in order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, summaries.get(name, "")


def documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a reader may give: not ``--help``, ``--version``, the
    subcommand slot, nor the hidden ones (``help=SUPPRESS``)."""
    return [action for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
            and action.help != argparse.SUPPRESS]


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every subcommand's parser below it, with the words
    that reach it (``("queue", "set")``)."""
    yield path, parser
    for name, sub, _summary in subcommands(parser):
        yield from walk(sub, (*path, name))


def help_text(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    """The help string as ``--help`` prints it (``%(default)s`` expanded)."""
    if not action.help:
        return ""
    params = {**vars(action), "prog": parser.prog}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    try:
        described = action.help % params
    except (KeyError, TypeError, ValueError):
        described = action.help
    # "(default: the CPU count, 8 here)": the value is the build machine's.
    return _HERE.sub(")", described)


_HERE = re.compile(r", [^,()]+ here\)")


def _signature(action: argparse.Action) -> str:
    if not action.option_strings:
        return code(action.metavar or action.dest)
    takes_value = action.nargs != 0
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return ", ".join(code(f"{flag} {metavar}" if takes_value else flag) for flag in action.option_strings)


def _default(action: argparse.Action) -> str | None:
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == 0 or default is False:
        return None
    if isinstance(default, (list, tuple)):
        default = ",".join(map(str, default))
    return str(default)


def _exclusive(parser: argparse.ArgumentParser, action: argparse.Action) -> list[argparse.Action]:
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            return [other for other in group._group_actions if other is not action]
    return []


def _argument_item(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    notes = []
    described = help_text(action, parser)
    if action.required and action.option_strings and "required" not in described:
        notes.append("required")  # unless its help says so already (its --help line needs it too)
    others = _exclusive(parser, action)
    if others:
        notes.append("not with " + ", ".join(code(other.option_strings[-1]) for other in others))
    default = _default(action)
    if default is not None and "default" not in described and "required" not in described:
        notes.append(f"default {code(default)}")
    if action.choices is not None and not all(str(choice) in described for choice in action.choices):
        notes.append("one of " + ", ".join(code(choice) for choice in action.choices))
    tail = f" ({'; '.join(notes)})" if notes else ""
    return f"- {_signature(action)}: {text(described)}{tail}"


def _shared(action: argparse.Action, top: argparse.ArgumentParser) -> bool:
    """An option every command takes, as the top-level parser declares it."""
    return any(action.option_strings == other.option_strings and action.help == other.help for other in top._actions
               if other.option_strings)


def cli_markdown(parser: argparse.ArgumentParser, heading: int = 2) -> str:
    """The reference of a command: its usage, its options, and every
    subcommand (recursively) with its arguments, flags, metavars, defaults
    and help, walked from the parser itself."""
    out = [f"```text\n{usage(parser)}\n```", text(parser.description or "")]
    if parser.epilog:
        out.append(text(parser.epilog))
    own = documented_actions(parser)
    if own:
        out.append(f"{'#' * heading} Options of {code(parser.prog)}")
        if any(True for _ in subcommands(parser)):
            out.append("Given before the command; those listed as common options under a command are "
                       "accepted after it too.")
        out.append("\n".join(_argument_item(parser, action) for action in own))
    for path, sub in walk(parser):
        if not path:
            continue
        summary = next((s for name, _p, s in subcommands(_parent(parser, path)) if name == path[-1]), "")
        level = heading + len(path) - 1
        out.append(f"{'#' * level} {' '.join(path)}")
        if summary:
            out.append(f"*{text(summary)}*")
        out.append(f"```text\n{usage(sub)}\n```")
        if sub.description:
            out.append(text(sub.description))
        actions = documented_actions(sub)
        shared = [action for action in actions if _shared(action, parser)]
        items = [_argument_item(sub, action) for action in actions if action not in shared]
        if items:
            out.append("\n".join(items))
        if shared:
            out.append("Common options: " + ", ".join(code(action.option_strings[-1]) for action in shared) + ".")
    return "\n\n".join(out) + "\n"


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage line as ``--help`` prints it, wrapped at a fixed width
    rather than the terminal's, so every build renders the same page."""
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


USAGE_WIDTH = 88


def _parent(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    for name in path[:-1]:
        parser = dict((n, p) for n, p, _s in subcommands(parser))[name]
    return parser


def undocumented_options(parser: argparse.ArgumentParser) -> list[str]:
    """``prog --option`` for every argument without help text (hidden ones,
    ``help=SUPPRESS``, are meant to be): what the reference would leave blank."""
    missing = []
    for _path, sub in walk(parser):
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if action.help is None or (action.help != argparse.SUPPRESS and not action.help.strip()):
                missing.append(f"{sub.prog} {'/'.join(action.option_strings) or action.dest}")
        for _name, _sub, summary in subcommands(sub):
            if not summary.strip():
                missing.append(f"{sub.prog} {_name} (no summary)")
    return missing


def everystep_cli() -> str:
    return cli_markdown(build_parser())


# -- metrics -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MetricInfo:
    """One metric as ``/metrics`` exposes it."""

    name: str  # the sample name: counters end in _total
    kind: str  # counter, gauge, histogram
    labels: tuple[str, ...]
    help: str
    aggregation: str | None  # how the supervisor sums a gauge over its processes


#: Label values the code fixes, from the vocabularies that fix them.
LABEL_VALUES: dict[str, tuple[str, ...]] = {
    "reason": metrics.RESTART_REASONS,
    "command": (*metrics.SUPERVISOR_COMMANDS, INVALID_COMMAND),
    "kind": wait_kinds.GAUGE_LABELS,
    "process": metrics.MEMORY_PROCESSES,
    "measure": metrics.MEMORY_MEASURES,
}


def metric_infos() -> list[MetricInfo]:
    """Every metric of ``everystep.metrics.Metrics``, read from the objects
    prometheus_client holds (the supervisor's metrics are defined there too)."""
    registry = metrics.get()
    if registry is None:
        raise RuntimeError("prometheus_client is not installed: the metrics reference cannot be generated")
    infos = []
    for spec in dataclasses.fields(registry):
        metric = getattr(registry, spec.name)
        if not hasattr(metric, "_type"):
            continue  # bookkeeping, not a metric
        kind = metric._type
        name = metric._name + ("_total" if kind == "counter" else "")
        aggregation = getattr(metric, "_multiprocess_mode", None) if kind == "gauge" else None
        infos.append(MetricInfo(name, kind, tuple(metric._labelnames), metric._documentation, aggregation))
    return sorted(infos, key=lambda info: info.name)


def metrics_markdown() -> str:
    rows = []
    for info in metric_infos():
        labels = ", ".join(code(label) for label in info.labels) or "none"
        kind = info.kind + (f" ({info.aggregation})" if info.aggregation else "")
        rows.append((code(info.name), kind, labels, text(info.help)))
    values = "\n".join(f"- {code(label)}: " + ", ".join(code(value) for value in known)
                       for label, known in LABEL_VALUES.items())
    return (table(("Name", "Type", "Labels", "Help"), rows)
            + "\n\nHistograms expose `_bucket`, `_sum` and `_count` series under their name. A gauge's "
              "aggregation says how the supervisor combines its processes' values: `livesum` adds the live "
              "processes', `livemax` takes the largest.\n\nLabel values fixed by the code:\n\n" + values + "\n")


# -- statuses ------------------------------------------------------------------

def _status_table(enum: Iterable[Status], groups: Mapping[str, Sequence[str]]) -> str:
    """One row per status: its word, the meaning declared with it
    (``everystep.models``), and the named sets it belongs to."""
    rows = []
    for member in enum:
        within = ", ".join(name for name, members in groups.items() if member in members)
        rows.append((code(member.value), member.meaning, within))
    return table(("Status", "Meaning", "In"), rows)


def statuses_markdown() -> str:
    run_groups = {"active": ACTIVE_STATUSES, "terminal": TERMINAL_STATUSES, "execution end": EXECUTION_ENDS,
                  "prunable": PRUNABLE_STATUSES, "cancellable": CANCELLABLE_STATUSES}
    step_groups = {"open": STEP_OPEN_STATUSES, "waiting": STEP_WAITING_STATUSES}
    return "\n\n".join([
        "## Run statuses\n\nStored in `everystep_workflow.status` (`everystep.models.RunStatus`).",
        _status_table(RunStatus, run_groups),
        "- *active*: not final yet: it may still be claimed, executed or resolved; retention never deletes it.\n"
        "- *terminal*: where `wait()` returns.\n"
        "- *execution end*: where an execution ends a run (counted by `everystep_workflow_runs_total`).\n"
        "- *prunable*: `everystep prune` may delete it.\n"
        "- *cancellable*: `everystep cancel` accepts it.\n\n"
        f"`{WAITING}` is not a status: lists of runs (`everystep runs --status {WAITING}`, the console's "
        "status filter) take it for the `scheduled` runs not due yet, waiting for a message, a child, a sleep, "
        "a retry's backoff or a delayed start.",
        "## Step statuses\n\nStored in `everystep_step.status` (`everystep.models.StepStatus`).",
        _status_table(StepStatus, step_groups),
        "- *open*: no final outcome yet; the step's next record overwrites it.\n"
        "- *waiting*: waits for its `wake_at`, a message or a child run.",
        "## Operator request statuses\n\nStored in `everystep_request.status` (`everystep remote`, the console).",
        _status_table(RequestStatus, {}),
    ]) + "\n"


# -- exit codes ----------------------------------------------------------------


def exit_codes_table(codes: dict[int, str]) -> str:
    return table(("Code", "Meaning"), [(code(number), text(meaning)) for number, meaning in codes.items()])


def exit_codes_markdown() -> str:
    return exit_codes_table(cliutil.EXIT_CODES) + "\n"


# -- environment ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    read_by: str
    meaning: str


#: Every environment variable the library reads. ``tests/test_docs.py`` greps
#: the code for names and fails on one missing here.
ENVIRONMENT: tuple[Variable, ...] = (
    Variable("EVERYSTEP_DATABASE_URL", "everystep, everystep-supervisor, the library",
             "the database when no `--database` or `database=` is given (default `sqlite:///everystep.db`)"),
    Variable("EVERYSTEP_LISTEN_DATABASE_URL", "everystep worker, everystep ui, everystep-supervisor, the library",
             "the PostgreSQL URL runners and the console LISTEN on when no `--listen-database` is given: a direct "
             "one when the database URL goes through a transaction pooler (`?pooler=transaction`)"),
    Variable("EVERYSTEP_UI_AUTH_TOKEN", "everystep ui",
             "the console's token when `--auth-token` is not given"),
    Variable("USER", "everystep remote", "who a request comes from (its `requested_by`, with the host name; "
             "else the numeric user id)"),
    Variable(history_bound.ENV_VAR, "everystep worker, everystep-supervisor, the library's Worker",
             "the history warning when no `--history-warning` or `history_warning=` is given: a run whose history "
             f"passes this many step records is said once in the log, pointing at `continue_as_new` (default "
             f"{history_bound.DEFAULT}; 0: never)"),
    Variable(streams.MAX_VALUE_BYTES_ENV, "the library (a stream write)",
             "the most bytes one stream value's JSON may take (default "
             f"{streams.DEFAULT_MAX_VALUE_BYTES:,}); a larger one is refused with `StreamRefused`"),
    Variable(streams.MAX_VALUES_ENV, "the library (a stream write)",
             f"the most values one stream may hold (default {streams.DEFAULT_MAX_VALUES:,}); the next is refused "
             "with `StreamRefused`"),
    Variable(metrics.MULTIPROC_ENV, "the library's metrics",
             "prometheus_client's multiprocess directory; the supervisor sets it to a private directory when "
             "`--metrics-port` is given, so every child's values are aggregated"),
)


def environment_table(variables: Iterable[Variable]) -> str:
    return table(("Variable", "Read by", "Meaning"),
                 [(code(var.name), var.read_by, var.meaning) for var in variables])


def environment_markdown() -> str:
    return environment_table(ENVIRONMENT) + "\n"


# -- tables --------------------------------------------------------------------


def schema() -> dict[str, dict[str, list[tuple[Any, ...]]]]:
    """The tables a migrated SQLite database has: per table its columns
    (name, type, not null, default, primary key) and indexes (name,
    unique, columns), read back from a fresh database the migrations built."""
    with tempfile.TemporaryDirectory(prefix="everystep-docgen-") as directory:
        path = os.path.join(directory, "schema.db")
        store = connect(f"sqlite:///{path}")
        try:
            store.schema_version()  # a SQLite database migrates itself when first opened
        finally:
            store.close()
        db = sqlite3.connect(path)
        try:
            names = [row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'everystep%' ORDER BY name")]
            tables: dict[str, dict[str, list[tuple[Any, ...]]]] = {}
            for name in names:
                columns = [(col[1], col[2], bool(col[3]), col[4], bool(col[5]))
                           for col in db.execute(f'PRAGMA table_info("{name}")')]
                indexes = []
                for index in db.execute(f'PRAGMA index_list("{name}")'):
                    index_columns = [col[2] or "(expression)" for col in db.execute(f'PRAGMA index_info("{index[1]}")')]
                    indexes.append((index[1], bool(index[2]), index_columns, bool(index[4])))
                tables[name] = {"columns": columns, "indexes": indexes}
            return tables
        finally:
            db.close()


def tables_markdown() -> str:
    out = []
    for name, spec in schema().items():
        out.append(f"### {code(name)}")
        out.append(table(("Column", "Type (SQLite)", "Not null", "Default", "Key"), [
            (code(column), text(kind), "yes" if notnull else "", code(default) if default is not None else "",
             "primary" if primary else "")
            for column, kind, notnull, default, primary in spec["columns"]]))
        named = [index for index in spec["indexes"] if not index[0].startswith("sqlite_autoindex")]
        unique = [index for index in spec["indexes"] if index[0].startswith("sqlite_autoindex")]
        lines = [f"- unique on ({', '.join(code(col) for col in index[2])})" for index in unique]
        lines += [f"- {code(index[0])}{' (unique)' if index[1] else ''}{' (partial)' if index[3] else ''}: "
                  f"{', '.join(code(col) for col in index[2])}" for index in named]
        if lines:
            out.append("Indexes:\n\n" + "\n".join(lines))
    return "\n\n".join(out) + "\n"


# -- what a body may call -------------------------------------------------------


def body_calls_markdown() -> str:
    """Every public function of ``everystep`` and what it is in a workflow
    body, read from the declarations next to each (``everystep.body_rules``)."""
    order = {BodyRule.RECORDED: 0, BodyRule.WAIT: 1, BodyRule.REFUSED: 2, BodyRule.PLAIN: 3}
    rows = []
    for name in sorted(everystep.__all__):
        obj = getattr(everystep, name)
        declared = declaration_of(obj)
        if declared is None or isinstance(obj, type):
            continue
        what = declared.note + (f" Use {declared.instead} instead." if declared.instead else "")
        rows.append((order[declared.rule], name, declared.rule.value, what))
    rows.sort()
    return table(("Call", "In a body", "What happens there"),
                 [(code(f"{name}()"), rule, text(what)) for _, name, rule, what in rows]) + "\n"


# -- placeholders --------------------------------------------------------------

#: ``<!-- generated: NAME -->`` → the function rendering it.
GENERATED: dict[str, Callable[[], str]] = {
    "everystep-cli": everystep_cli,
    "metrics": metrics_markdown,
    "statuses": statuses_markdown,
    "exit-codes": exit_codes_markdown,
    "environment": environment_markdown,
    "tables": tables_markdown,
    "body-calls": body_calls_markdown,
}
