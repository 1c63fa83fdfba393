"""The commands that keep running: ``worker`` (the threaded runner, also
``manage.py everystep_worker``, which shares its options) and ``ui`` (the
operations console)."""

from __future__ import annotations

import argparse
import os
import sys

from .. import history_bound, registry, versions
from ..cliutil import LOG_LEVELS, PORT, add_logging_arguments, count, queue_list, seconds, setup_logging
from ..errors import EverystepError
from ..lease import DEFAULT_LEASE
from ..context import Observer
from ..store import Store
from ..worker import Worker, refuse_step_limits
from .command import Command

#: Options of everystep-supervisor the threaded worker cannot honour.
WORKER_REFUSED = ("--step-memory-limit", "--step-cpu-limit")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--pool", type=count(1, 1024), default=4, metavar="N",
                        help="threads executing runs, 1 to 1024 (default 4)")
    parser.add_argument("--async-runs", type=count(1, 100000), default=100, metavar="N",
                        help="async runs held at once on the worker's one event loop, beside the threads "
                             "(default 100)")
    parser.add_argument("--poll", type=seconds(0.01, 3600), default=0.2, metavar="S",
                        help="seconds between claims when idle; a fallback to LISTEN/NOTIFY on PostgreSQL "
                             "(default 0.2)")
    parser.add_argument("--listen-database", metavar="URL", default=None,
                        help="PostgreSQL URL to LISTEN on for new runs: a direct one when --database goes through "
                             "a transaction pooler (?pooler=transaction), which cannot carry LISTEN (default: "
                             "$EVERYSTEP_LISTEN_DATABASE_URL, else --database; behind a transaction pooler "
                             "without one, pickup is by polling)")
    parser.add_argument("-n", "--name", metavar="NAME",
                        help="runner name, stable across restarts; refused while a live runner holds it "
                             "(default: the hostname)")
    parser.add_argument("--queues", type=queue_list, default=None, metavar="NAME[,NAME]",
                        help="claim only from these queues (default: every queue)")
    parser.add_argument("--app-version", metavar="V", default=None,
                        help="the code version runs scheduled here record (periodic ticks) (default: a hash of "
                             "each workflow's code and steps)")
    parser.add_argument("--takeover", action="store_true",
                        help="take the runner name even though its holder looks alive (it is gone for good, "
                             "e.g. a frozen VM); its runs are fenced (default: off)")
    parser.add_argument("--drain", type=seconds(0), default=30.0, metavar="S",
                        help="seconds a stop waits for runs in flight (default 30)")
    parser.add_argument("--lease", type=seconds(1), default=DEFAULT_LEASE, metavar="S",
                        help="heartbeat lease: runners silent longer than S seconds have their runs requeued "
                             f"(default {DEFAULT_LEASE:g})")
    parser.add_argument("--metrics-port", type=PORT, default=0, metavar="PORT",
                        help="serve /metrics and /healthz on this port, 1 to 65535 (default 0: off)")
    parser.add_argument("--metrics-bind", default="0.0.0.0", metavar="ADDR",
                        help="address for --metrics-port (default 0.0.0.0)")
    parser.add_argument("--history-warning", type=count(0, 10**9), default=None, metavar="N",
                        help=history_bound.OPTION_HELP)
    add_logging_arguments(parser)
    # everystep-supervisor's options, refused here with the reason rather
    # than as unrecognized.
    for flag in WORKER_REFUSED:
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)


def cmd_worker(store: Store, args: argparse.Namespace, observer: Observer | None = None) -> int:
    for flag in WORKER_REFUSED:
        if getattr(args, flag.lstrip("-").replace("-", "_"), None) is not None:
            raise EverystepError(f"{flag} cannot be enforced by the threaded worker (its runs share one process); "
                                 "run everystep-supervisor for step resource limits")
    refuse_step_limits()
    versions.set_app_version(args.app_version)
    worker = Worker(pool_size=args.pool, poll=args.poll, name=args.name, drain=args.drain, database=store,
                    async_runs=args.async_runs,
                    metrics_port=args.metrics_port, metrics_bind=args.metrics_bind, lease=args.lease,
                    takeover=args.takeover, observer=observer, queues=args.queues,
                    history_warning=args.history_warning)
    # Touch the database once before working: a wrong URL or an unmigrated
    # database is a bad command line (one line, exit 2), whereas the claim
    # loop would log and retry it forever as if it were a passing outage.
    # Taking the runner name now refuses a name a live runner holds.
    store.count_scheduled(registry.workflow_names())
    worker.loop.lease.register()
    setup_logging(args.log_level, args.log_format)
    leftovers = worker.run()
    if leftovers:
        # Threads are still stuck in steps whose runs were given up at the
        # drain deadline: exit now instead of joining them at interpreter
        # shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                        help="address to listen on (default 127.0.0.1; any other needs --auth-token)")
    parser.add_argument("--port", type=PORT, default=8765, metavar="PORT",
                        help="port, 0 to pick a free one (default 8765)")
    parser.add_argument("--auth-token", metavar="TOKEN", default=None,
                        help="require this token (Bearer, or as the basic-auth password) "
                             "(default: $EVERYSTEP_UI_AUTH_TOKEN, else none)")
    parser.add_argument("--read-database", metavar="URL", default=None,
                        help="a read replica the pages read from (read-only sessions); actions still go to "
                             "--database, the primary (default: --database)")
    parser.add_argument("-l", "--log-level", default="info", choices=LOG_LEVELS, metavar="LEVEL",
                        help=f"one of {', '.join(LOG_LEVELS)} (default info)")


def cmd_ui(store: Store, args: argparse.Namespace) -> int:
    try:
        from ..web.serve import serve
    except ImportError as exc:
        raise EverystepError(f"the console needs the ui extra (pip install 'everystep[ui]'): {exc}") from None
    token = args.auth_token if args.auth_token is not None else os.environ.get("EVERYSTEP_UI_AUTH_TOKEN")
    setup_logging(args.log_level)
    return serve(store.url, bind=args.bind, port=args.port, auth_token=token or None, app_modules=args.app,
                 read_database_url=args.read_database)


UI = Command("ui", "serve the operations console (needs the ui extra)",
             "Serve the web console: runs, step graphs, runners, blocked runs and the operator's actions.",
             cmd_ui, _ui_arguments)
WORKER = Command("worker", "run a threaded worker (embedded mode)",
                 "Claim runs and execute them on a thread pool in this process (the supervisor is the runner for "
                 "CPU-bound work and step timeouts).",
                 cmd_worker, add_worker_arguments)

__all__ = ["UI", "WORKER", "WORKER_REFUSED", "add_worker_arguments", "cmd_worker"]
