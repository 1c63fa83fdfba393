"""``everystep-supervisor``: the prefork runner, and ``ctl`` to talk to it."""

from __future__ import annotations

import argparse
import glob
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

import psutil

from everystep import history_bound, metrics, registry, versions
from everystep.cliutil import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    PORT,
    OneLineParser,
    add_logging_arguments,
    count,
    exit_codes_epilog,
    queue_list,
    fail,
    seconds,
    setup_logging,
    version,
)
from everystep.errors import EverystepError, NameInUse, SchemaMissing, StoreMisconfigured, StoreUnavailable
from everystep.resources import parse_size
from everystep.store import Store, connect

from . import ctl, heap
from .claim_ahead import SHORT_RUN
from .config import MAX_PROCS, Config, default_socket_path
from .verbs import VERBS

if TYPE_CHECKING:
    from .sdnotify import Notifier

PROG = "everystep-supervisor"
METRICS_DIR_PREFIX = "everystep-metrics-"
logger = logging.getLogger("everystep.supervisor")
#: What each exit code of ``everystep-supervisor`` means: its ``--help``
#: epilog and the reference (``supervisor.docgen``) both read this table.
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done",
    EXIT_FAILED: "stopped by a failure (children failing to boot, runner name taken over)",
    EXIT_USAGE: "bad command line (a --max-memory-per-child below what a new child owns included) or a "
                "database that refuses the configuration (no such database or role, a bad password or option)",
    EXIT_UNAVAILABLE: "database still unreachable when --wait-for-database ran out",
}


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except EverystepError:
        raise argparse.ArgumentTypeError(f"must be a size like 512M or 2G, not {text!r}") from None


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog=PROG,
        description="Run everystep workflows in forked child processes (one run per child at a time).",
        epilog="Signals: TERM/INT drain (a second INT stops at once), QUIT fast stop, HUP reload, TTIN/TTOU "
               f"one child more/less. Control a running supervisor with '{PROG} ctl --help'. "
               + exit_codes_epilog(EXIT_CODES, ", "),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument("-A", "--app", metavar="MODULE[,MODULE]", default="",
                        help="modules defining your workflows, imported once before forking (default: none)")
    parser.add_argument("--database", metavar="URL",
                        help="database URL (default: $EVERYSTEP_DATABASE_URL, else sqlite:///everystep.db)")
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option but ``--app`` and ``--database``, which a host framework
    (Django's ``everystep_supervisor`` command) takes from its own settings."""
    defaults = Config()
    parser.add_argument("-c", "--procs", type=count(0, MAX_PROCS), default=defaults.procs, metavar="N",
                        help=f"child processes, 0 to {MAX_PROCS} (default: the CPU count, {defaults.procs} here)")
    parser.add_argument("-n", "--name", default=defaults.name, metavar="NAME",
                        help="runner name, stable across restarts: runs are claimed under it; refused while a "
                             f"live runner holds it (default: the hostname, {defaults.name} here)")
    parser.add_argument("--queues", type=queue_list, default=None, metavar="NAME[,NAME]",
                        help="claim only from these queues (default: every queue)")
    parser.add_argument("--app-version", metavar="V", default=None,
                        help="the code version runs scheduled here record (periodic ticks) (default: a hash of "
                             "each workflow's code and steps)")
    parser.add_argument("--serve-versions", metavar="current|all|V1,V2", default="all",
                        help="claim only runs started under these code versions: current (those of the workflows "
                             "loaded here, or --app-version), all, or a list; runs with no version recorded go to "
                             "any runner (default: all)")
    parser.add_argument("--takeover", action="store_true",
                        help="take the runner name even though its holder looks alive (it is gone for good, "
                             "e.g. a frozen VM); the runs it held are fenced (default: off)")
    parser.add_argument("--poll", type=seconds(0.01, 3600), default=defaults.poll, metavar="S",
                        help="seconds between claims when idle; a fallback to LISTEN/NOTIFY on PostgreSQL "
                             f"(default {defaults.poll:g})")
    parser.add_argument("--listen-database", metavar="URL", default=None,
                        help="PostgreSQL URL to LISTEN on for new runs, fences and requests: a direct one when "
                             "--database goes through a transaction pooler (?pooler=transaction), which cannot "
                             "carry LISTEN (default: $EVERYSTEP_LISTEN_DATABASE_URL, else --database; behind a "
                             "transaction pooler without one, pickup is by polling)")
    parser.add_argument("--claim-ahead", type=count(0, 64), default=defaults.claim_ahead, metavar="N",
                        help=f"while every child is busy with short runs (under {SHORT_RUN:g} s on average), claim "
                             "up to N runs at once (four per child at most) and hold them for the next children to "
                             "free, so they start without waiting for a claim "
                             f"(default {defaults.claim_ahead}; 0: never)")
    parser.add_argument("--drain", type=seconds(0), default=defaults.drain, metavar="S",
                        help="seconds a stop waits for steps in flight before killing and requeueing "
                             f"(default {defaults.drain:g}; 0 waits forever)")
    parser.add_argument("--step-timeout", type=seconds(0), default=0.0, metavar="S",
                        help="kill a step running longer than S seconds unless it sets its own timeout "
                             "(default 0: none)")
    parser.add_argument("--step-memory-limit", type=_size, default=None, metavar="SIZE",
                        help="memory a step may add to its process unless it sets its own memory_limit, "
                             "e.g. 512M or 2G (default: none)")
    parser.add_argument("--step-cpu-limit", type=seconds(0.001), default=None, metavar="S",
                        help="CPU seconds a step may use unless it sets its own cpu_limit (default: none)")
    parser.add_argument("--cgroups", choices=["auto", "off"], default="auto", metavar="auto|off",
                        help="give each child a cgroup where the host allows it, so the kernel bounds step "
                             "memory and attributes out-of-memory kills (default auto; off: rlimits only)")
    parser.add_argument("--max-runs-per-child", type=count(0, 10**9), default=0, metavar="N",
                        help="recycle a child after N runs (default 0: never)")
    parser.add_argument("--max-memory-per-child", type=count(0, 10**7), default=0, metavar="MB",
                        help="recycle a child that owns more than MB after a run: its USS (pages only it "
                             "holds, from /proc/PID/smaps_rollup; RSS where unreadable), checked at most once a "
                             "second; refused at start if below a new child's USS (default 0: never)")
    parser.add_argument("--max-crashes", type=count(1, 1000), default=defaults.max_crashes, metavar="N",
                        help=f"fail a run after its child died N times running it (default {defaults.max_crashes})")
    parser.add_argument("--socket", default=None, metavar="PATH",
                        help="control socket (default: everystep-supervisor.sock in $RUNTIME_DIRECTORY, else "
                             "in the working directory)")
    parser.add_argument("--burst", action="store_true",
                        help="exit once nothing is scheduled and every child is idle (default: off)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="log a progress line every 2 s and a summary at exit (default: on with --burst)")
    parser.add_argument("--lease", type=seconds(1), default=defaults.lease, metavar="S",
                        help="heartbeat lease: runners silent longer than S seconds have their runs requeued "
                             f"by any live runner (default {defaults.lease:g})")
    parser.add_argument("--metrics-port", type=PORT, default=0, metavar="PORT",
                        help="serve /metrics (all processes aggregated) and /healthz on this port, 1 to 65535 "
                             "(default 0: off)")
    parser.add_argument("--metrics-bind", default=defaults.metrics_bind, metavar="ADDR",
                        help=f"address for --metrics-port (default {defaults.metrics_bind})")
    parser.add_argument("--wait-for-database", type=seconds(0), default=None, metavar="S",
                        help="at start, wait up to S seconds for an unreachable database, retrying with backoff "
                             "(systemd sees STATUS=waiting for the database), then exit 3; 0 exits 3 at once "
                             "(default: wait as long as it takes). A database refusing the configuration (no "
                             "such database or role) exits 2 at once")
    parser.add_argument("--db-timeout", type=seconds(0.1, 3600), default=defaults.db_timeout, metavar="S",
                        help="bound on every database statement the parent makes, and on connecting "
                             f"(default {defaults.db_timeout:g}); children are not bounded")
    parser.add_argument("--control-timeout", type=seconds(0.1, 3600), default=defaults.control_timeout,
                        metavar="S", help="drop control-socket clients silent for S seconds "
                                          f"(default {defaults.control_timeout:g})")
    parser.add_argument("--stall-timeout", type=seconds(0.1, 3600), default=defaults.stall_timeout,
                        metavar="S", help="kill a child that has not read a run handed to it for S seconds "
                                          f"(default {defaults.stall_timeout:g})")
    parser.add_argument("--history-warning", type=count(0, 10**9), default=None, metavar="N",
                        help=history_bound.OPTION_HELP)
    add_logging_arguments(parser)


def build_ctl_parser() -> OneLineParser:
    parser = OneLineParser(prog=f"{PROG} ctl", description="Inspect and control a running supervisor through its "
                           "control socket (this host only; 'everystep remote' reaches any host).")
    parser.add_argument("--socket", default=None, metavar="PATH",
                        help="control socket of the supervisor (default: everystep-supervisor.sock in "
                             "$RUNTIME_DIRECTORY, else in the working directory)")
    parser.add_argument("--json", action="store_true", help="print the raw JSON reply (default: a table or a line)")
    parser.add_argument("--timeout", type=seconds(0.1, 3600), default=10.0, metavar="S",
                        help="seconds to wait for a reply (default 10)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=OneLineParser)
    actions.required = True
    for verb in VERBS.values():
        sub = actions.add_parser(verb.command, help=verb.summary, description=verb.description)
        verb.arguments(sub)
        sub.set_defaults(verb=verb)
    for sub in actions.choices.values():
        sub.add_argument("--socket", default=argparse.SUPPRESS, metavar="PATH", help=argparse.SUPPRESS)
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "ctl":
        args = build_ctl_parser().parse_args(argv[1:])
        args.socket = args.socket or default_socket_path()
        return ctl.main(args)
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    return run(config_from_args(args, args.app, args.database))


def config_from_args(args: argparse.Namespace, app: str | Sequence[str], database: str | None) -> Config:
    """The Config that options declared by ``add_arguments`` describe;
    exits 2 with one line on a bad combination."""
    modules = app.split(",") if isinstance(app, str) else list(app)
    config = Config(
        app=[module.strip() for module in modules if module.strip()],
        procs=args.procs,
        database=database,
        name=args.name,
        poll=args.poll,
        claim_ahead=args.claim_ahead,
        drain=args.drain,
        step_timeout=args.step_timeout or None,
        max_runs_per_child=args.max_runs_per_child,
        max_memory_per_child=args.max_memory_per_child,
        max_crashes=args.max_crashes,
        step_memory_limit=args.step_memory_limit,
        step_cpu_limit=args.step_cpu_limit,
        cgroups=args.cgroups != "off",
        socket=os.path.abspath(args.socket or default_socket_path()),
        burst=args.burst,
        progress=args.progress,
        lease=args.lease,
        takeover=args.takeover,
        metrics_port=args.metrics_port,
        metrics_bind=args.metrics_bind,
        db_timeout=args.db_timeout,
        control_timeout=args.control_timeout,
        stall_timeout=args.stall_timeout,
        queues=args.queues,
        wait_for_database=args.wait_for_database,
        listen_database=args.listen_database,
        app_version=args.app_version,
        serve_versions=args.serve_versions,
        history_warning=args.history_warning,
    )
    _check_socket_path(config.socket)
    try:
        config.history_warning = history_bound.threshold(config.history_warning)  # $EVERYSTEP_HISTORY_WARNING read once
    except EverystepError as exc:
        fail(str(exc), prog=PROG)
    return config


def _check_socket_path(path: str) -> None:
    """A control socket path must fit a Unix socket address, in a directory
    that exists: said at parse time, not as a traceback at bind time."""
    from .control import MAX_UNIX_PATH

    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        fail(f"--socket {path} is too long for a Unix socket ({MAX_UNIX_PATH} bytes at most)", prog=PROG)
    if not os.path.isdir(os.path.dirname(path)):
        fail(f"--socket {path}: directory {os.path.dirname(path)} does not exist", prog=PROG)


def run(config: Config) -> int:
    metrics_dir = _private_metrics_dir() if config.metrics_port else None
    try:
        return _run(config)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _private_metrics_dir() -> str:
    """prometheus_client's multiprocess mode is chosen when it is first
    imported: point it at a fresh private directory before the app (or
    anything else) imports it, so every child's values are aggregated."""
    if "prometheus_client" in sys.modules:
        logger.warning("prometheus_client was imported before the supervisor configured it; "
                       "metrics from children may be missing")
    _remove_stale_metrics_dirs()
    path = tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")
    os.environ[metrics.MULTIPROC_ENV] = path
    return path


def _remove_stale_metrics_dirs() -> None:
    """A SIGKILLed supervisor cannot clean up after itself: the next one
    removes directories whose owner pid is gone."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{METRICS_DIR_PREFIX}*-*")):
        owner = os.path.basename(path)[len(METRICS_DIR_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            shutil.rmtree(path, ignore_errors=True)


def _run(config: Config) -> int:
    from .sdnotify import Notifier
    from .startup import STOPPED_AT_START, StopAtStart, stop_signals

    notifier = Notifier.from_env(unset=True)
    who = f"{PROG} {config.name}"
    with stop_signals():
        try:
            return _start(config, notifier, who)
        except StopAtStart as stop:
            # Nothing claimed yet: the drain a stop signal asks for is done.
            code = STOPPED_AT_START[signal.Signals(stop.signum)]
            logger.info("%s: %s received while starting; nothing was started", who, signal.Signals(stop.signum).name)
            notifier.stopping()
            logger.info("%s: stopped (exit code %d)", who, code)
            return code


def _start(config: Config, notifier: Notifier, who: str) -> int:
    from .arbiter import Arbiter
    from .control import ControlSocketError
    from .startup import wait_for_database, warn_fork_hazards

    heap.hold()  # the app's heap stays whole until the fork (heap.py)
    try:
        registry.import_apps(config.app)
        warn_fork_hazards(logger, f"{PROG} {config.name}")
        versions.set_app_version(config.app_version)
        store = connect(config.database, statement_timeout=config.db_timeout, listen_url=config.listen_database)
        wait_for_database(lambda: _check_database(store), limit=config.wait_for_database, notifier=notifier,
                          logger=logger, who=who, where=store.describe())
    except StoreMisconfigured as exc:
        fail(str(exc), prog=PROG)  # no waiting fixes it
    except StoreUnavailable as exc:
        fail(str(exc), prog=PROG, code=EXIT_UNAVAILABLE)
    except EverystepError as exc:
        fail(str(exc), prog=PROG)
    arbiter = Arbiter(config, store, notifier)
    try:
        return arbiter.run()
    except (ControlSocketError, NameInUse) as exc:
        fail(str(exc), prog=PROG)
    except StoreUnavailable as exc:  # gone again between the wait and taking the runner name
        fail(str(exc), prog=PROG, code=EXIT_UNAVAILABLE)


def _check_database(store: Store) -> None:
    """Fail fast, in one line, on an unreachable or unmigrated database."""
    if store.schema_version() == 0:
        raise SchemaMissing(
            f"database {store.describe()} has no everystep schema; run: everystep migrate --database URL"
        )


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
