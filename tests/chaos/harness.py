"""The chaos suite: real supervisors, real kills, a real PostgreSQL restart.

N runs mix safe steps, an unsafe-to-repeat step, a parallel fork and
``Terminal`` stops, and a share of them talk: each waits for a message the
harness sends, starts a child run, sends it a message and waits for its
answer; each effect is logged to ``chaos_effect`` as it happens.
While they execute, the harness injects faults at random (seeded): SIGKILL
of a child, SIGKILL of a supervisor followed by a restart under the same
name or under a new one (its runs then come back through lease expiry), a
SIGTERM rollout, and a PostgreSQL restart (fast or crash).

Afterwards it lets the survivors finish, resolves blocked runs the way an
operator would (the effect log says whether the uncertain effect happened),
stops everything with SIGTERM and checks:

- every run is terminal: ``completed`` with the right result, or ``stopped``
  by its ``Terminal``; ``blocked`` only at the unsafe step;
- no unsafe effect happened twice; every safe effect of a finished run
  happened at least once (more is at-least-once, and is counted);
- every message was consumed exactly once (each by one recv step, whose
  recorded result is its payload), no talking run scheduled its child
  twice, and the message and the detached run its body sends and
  schedules itself (no idempotency key) exist once each;
- nothing is left claimed, and every supervisor stopped with exit code 0.

With ``pooler`` the supervisors and the feeder reach PostgreSQL through a
real PgBouncer in transaction mode (``?pooler=transaction``; the first
supervisor LISTENs on the direct URL, the others poll), and PgBouncer
itself is hit too: ``RECONNECT`` (every server connection closed once
released), ``KILL`` of the database (every client and server connection
dropped at once, then ``RESUME``) and a restart of its process. The same
checks hold: nothing lost, no run failed by the pooler.

With ``loops``, runs that live for ever are fed messages all through the
faults and continue as new every ``loop_every`` of them (``loops.py``): no
message lost or consumed twice across the continuations.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

from everystep import admin, schedule, send
from everystep.models import BLOCKED, COMPLETED, STEP_STARTED, STOPPED
from everystep.store import connect
from tests.chaos import app
from tests.chaos.loops import LoopFeeder, verify_loops
from tests.support.pgbouncer import PgBouncer, start_pgbouncer
from tests.support.pgserver import PgServer, start_server

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ChaosConfig:
    runs: int = 80
    duration: float = 40.0
    fault_every: float = 2.0
    supervisors: int = 2
    procs: int = 2
    lease: float = 3.0
    drain: float = 3.0
    step_ms: int = 150
    unsafe_share: float = 0.35
    stop_share: float = 0.1
    talk_share: float = 0.3
    seed: int = 1
    settle_timeout: float = 180.0
    database: str | None = None
    #: Through PgBouncer in transaction mode, with its own faults.
    pooler: bool = False
    #: Looping runs (``loops.py``): each sent ``loop_messages`` numbers while
    #: the faults land, continuing as new every ``loop_every`` of them.
    loops: int = 0
    loop_messages: int = 1200
    loop_every: int = 500


@dataclass
class Report:
    counts: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        keys = ("runs", "completed", "stopped", "blocked", "resolved_result", "resolved_discard",
                "child_kills", "supervisor_kills", "restarts_same_name", "restarts_new_name", "rollouts",
                "pg_restarts", "pooler_reconnects", "pooler_kills", "pooler_restarts", "duplicated_safe_effects",
                "duplicated_unsafe_effects", "talking", "messages_consumed", "children", "loops",
                "loop_continuations", "loop_messages")
        return "chaos: " + " ".join(f"{key}={self.counts[key]}" for key in keys) + \
            f" violations={len(self.violations)}"


class Supervisor:
    """One ``everystep-supervisor`` process under the harness's control."""

    def __init__(self, name: str, config: ChaosConfig, url: str, workdir: Path, env: dict[str, str],
                 listen_url: str | None = None) -> None:
        self.name = name
        self.config = config
        self.url = url
        self.listen_url = listen_url
        self.workdir = workdir
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_codes: list[int] = []

    def start(self) -> None:
        log = open(self.workdir / f"{self.name}.log", "ab")
        listen = ["--listen-database", self.listen_url] if self.listen_url else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "--app", "tests.chaos.app",
             "--procs", str(self.config.procs), "--database", self.url, "--name", self.name,
             "--socket", str(self.workdir / f"{self.name}.sock"), "--lease", str(self.config.lease),
             "--drain", str(self.config.drain), "--poll", "0.2", "--max-crashes", "1000",
             "--log-level", "warning", *listen],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True,
        )
        log.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[psutil.Process]:
        if not self.alive:
            return []
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []

    def kill(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def wait_ready(self, timeout: float) -> bool:
        """Until the control socket answers ``status``: from then on the
        supervisor has its signal handlers, so SIGTERM drains it. A process
        still booting (restarted a moment ago) would die of the signal's
        default action instead, exit -15, and say nothing of draining."""
        deadline = time.monotonic() + timeout
        path = str(self.workdir / f"{self.name}.sock")
        while self.alive and time.monotonic() < deadline:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                    client.settimeout(5)
                    client.connect(path)
                    client.sendall(b'{"cmd": "status"}\n')
                    if client.makefile("rb").readline().strip():
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def terminate(self, timeout: float) -> int | None:
        if not self.alive:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.exit_codes.append(code)
        return code

    def reap_orphans(self) -> None:
        """Children of a SIGKILLed parent drain and exit by themselves
        (PR_SET_PDEATHSIG); this only makes sure none outlives the test."""
        for proc in psutil.process_iter(["cmdline"]):
            try:
                title = " ".join(proc.info["cmdline"] or [])
            except psutil.Error:
                continue
            if title.startswith("everystep-supervisor: child") and proc.ppid() == 1:
                try:
                    proc.kill()
                except psutil.Error:
                    pass


def _prepare_database(server: PgServer, config: ChaosConfig) -> str:
    url = server.create_database("everystep_chaos")
    with psycopg.connect(url, autocommit=True) as conn:
        # Effects must survive a PostgreSQL crash once committed.
        dbname = conn.info.dbname
        conn.execute(f'ALTER DATABASE "{dbname}" SET synchronous_commit = on')
    connect(url).migrate()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE chaos_effect (id bigserial PRIMARY KEY, run_key text NOT NULL, effect text NOT NULL,"
            " kind text NOT NULL, pid integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
    return url


def _plan_runs(config: ChaosConfig, rng: random.Random) -> list[dict]:
    return [
        {
            "key": f"r{index}",
            "ms": config.step_ms,
            "unsafe": rng.random() < config.unsafe_share,
            "stop": rng.random() < config.stop_share,
            "talk": rng.random() < config.talk_share,
        }
        for index in range(config.runs)
    ]


class Feeder:
    """Schedules the planned runs over most of the fault phase, so faults
    land on a loaded system rather than an idle one."""

    def __init__(self, url: str, planned: list[dict], spread: float) -> None:
        self.url = url
        self.planned = planned
        self.spread = spread
        self.runs: dict[str, dict] = {}
        self.started = time.monotonic()
        #: Talking runs still to be sent their "go" message.
        self.unsent: list[str] = []

    def feed(self, everything: bool = False) -> None:
        elapsed = time.monotonic() - self.started
        share = 1.0 if everything or self.spread <= 0 else min(1.0, 0.1 + 0.9 * elapsed / self.spread)
        due = int(len(self.planned) * share)
        while len(self.runs) < due:
            args = self.planned[len(self.runs)]
            try:
                store = connect(self.url)
                try:
                    # The key makes a retry after an ambiguous failure return the same run.
                    run = schedule(app.chaos_flow, args, idempotency_key=args["key"], database=store)
                    self.runs[run.id] = args
                    if args.get("talk"):
                        self.unsent.append(run.id)
                finally:
                    store.close()
            except Exception:
                return  # the database is restarting: try again on the next tick
        self.send()

    def send(self) -> None:
        """The message each talking run waits for (idempotent: a send retried
        after an ambiguous failure stores nothing more)."""
        while self.unsent:
            run_id = self.unsent[0]
            key = self.runs[run_id]["key"]
            try:
                store = connect(self.url)
                try:
                    send(run_id, "go", f"{key}:go", idempotency_key=f"{key}:go", database=store)
                finally:
                    store.close()
            except Exception:
                return
            self.unsent.pop(0)


def _wait_settled(url: str, supervisors: list[Supervisor], deadline: float) -> bool:
    """Until no run is scheduled or running, keeping the supervisors up."""
    while time.monotonic() < deadline:
        for sup in supervisors:
            if not sup.alive:
                sup.start()
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                busy = conn.execute(
                    "SELECT count(*) FROM everystep_workflow WHERE status IN ('scheduled', 'running')"
                ).fetchone()[0]
        except psycopg.OperationalError:
            busy = -1
        if busy == 0:
            return True
        time.sleep(0.5)
    return False


def _inject(fault: str, supervisors: list[Supervisor], server: PgServer, rng: random.Random,
            report: Report, config: ChaosConfig, make_name: callable, bouncer: PgBouncer | None = None,
            dbname: str = "") -> None:
    live = [sup for sup in supervisors if sup.alive]
    if bouncer is not None and fault.startswith("pooler_"):
        _inject_pooler(fault, bouncer, dbname, report)
        return
    if fault == "child" and live:
        kids = rng.choice(live).children()
        if kids:
            try:
                rng.choice(kids).kill()
                report.counts["child_kills"] += 1
            except psutil.Error:
                pass
    elif fault in ("kill_same", "kill_new") and live:
        sup = rng.choice(live)
        sup.kill()
        report.counts["supervisor_kills"] += 1
        if fault == "kill_new":
            sup.name = make_name()
            report.counts["restarts_new_name"] += 1
        else:
            report.counts["restarts_same_name"] += 1
        sup.start()
    elif fault == "rollout" and live:
        sup = rng.choice(live)
        sup.terminate(config.drain + 30)
        sup.kill()  # if it did not stop in time, it is a crash
        report.counts["rollouts"] += 1
        sup.start()
    elif fault == "pg" and server.owned:
        if rng.random() < 0.5:
            server.stop("immediate")  # a crash: recovery replays the WAL
        else:
            server.stop("fast")
        time.sleep(rng.uniform(0.2, 2.0))
        server.start()
        report.counts["pg_restarts"] += 1


def _inject_pooler(fault: str, bouncer: PgBouncer, dbname: str, report: Report) -> None:
    """PgBouncer's own faults: each may refuse a moment while PgBouncer is
    restarting itself, which is one more fault, not a failure of the run."""
    try:
        if fault == "pooler_reconnect":
            bouncer.admin("RECONNECT")
            report.counts["pooler_reconnects"] += 1
        elif fault == "pooler_kill":
            bouncer.kill_database(dbname)
            report.counts["pooler_kills"] += 1
        else:
            bouncer.restart()
            report.counts["pooler_restarts"] += 1
    except (psycopg.OperationalError, RuntimeError):
        pass


def _resolve_blocked(url: str, runs: dict[str, dict], report: Report) -> None:
    """What an operator does: check the external system (the effect log)."""
    store = connect(url)
    with psycopg.connect(url, autocommit=True) as conn:
        for run in store.list_runs(status=BLOCKED, limit=100_000):
            args = runs.get(run.id)
            if args is None:
                report.violations.append(f"run {run.id} ({run.name}) blocked")
                continue
            started = [step for step in store.get_steps(run.id) if step.status == STEP_STARTED]
            if not args["unsafe"] or [step.step_id for step in started] != ["charge"]:
                report.violations.append(f"run {run.id} blocked at {[s.step_id for s in started]} "
                                         f"(unsafe={args['unsafe']})")
                continue
            happened = conn.execute(
                "SELECT count(*) FROM chaos_effect WHERE run_key = %s AND effect = 'u'", (args["key"],)
            ).fetchone()[0]
            if happened:
                admin.resolve_step(store, run.id, "charge", result=f"{args['key']}:u")
                report.counts["resolved_result"] += 1
            else:
                admin.resolve_step(store, run.id, "charge", discard=True)
                report.counts["resolved_discard"] += 1
            report.counts["blocked"] += 1
    store.close()


def _verify(url: str, runs: dict[str, dict], report: Report) -> None:
    store = connect(url)
    with psycopg.connect(url, autocommit=True) as conn:
        effects = Counter(
            (key, effect, kind) for key, effect, kind in conn.execute(
                "SELECT run_key, effect, kind FROM chaos_effect").fetchall()
        )
        leftover = conn.execute(
            "SELECT count(*) FROM everystep_workflow WHERE status IN ('running', 'scheduled')").fetchone()[0]
    if leftover:
        report.violations.append(f"{leftover} run(s) still scheduled or running")
    for (key, effect, kind), count in effects.items():
        if count > 1:
            report.counts[f"duplicated_{kind}_effects"] += count - 1
            if kind == "unsafe":
                report.violations.append(f"unsafe effect {effect} of {key} happened {count} times")
    _verify_talk(store, runs, report)
    for run_id, args in runs.items():
        run = store.get_run(run_id)
        key = args["key"]
        if run.status == COMPLETED and not args["stop"]:
            report.counts["completed"] += 1
            if run.result != app.expected_result(args):
                report.violations.append(f"run {run_id} completed with {run.result!r}")
        elif run.status == STOPPED and args["stop"]:
            report.counts["stopped"] += 1
            if (run.error or {}).get("type") != "everystep.errors.Terminal" or effects[(key, "e", "safe")]:
                report.violations.append(f"run {run_id} stopped wrongly: {run.error!r}")
        else:
            report.violations.append(f"run {run_id} ({args}) ended {run.status}: {run.error!r}")
            continue
        for effect in app.safe_effects(args):
            if effects[(key, effect, "safe")] < 1:
                report.violations.append(f"safe effect {effect} of {key} never happened")
        if args["unsafe"] and effects[(key, "u", "unsafe")] != 1:
            report.violations.append(f"unsafe effect of {key} happened {effects[(key, 'u', 'unsafe')]} times")
    store.close()


def _verify_talk(store: Any, runs: dict[str, dict], report: Report) -> None:
    """Every message consumed exactly once, by a recv step whose recorded
    result is its payload; every talking run started exactly one child and
    scheduled one detached run from its body."""
    notes = Counter(run.args[0] for run in store.list_runs(name=app.chaos_note.name, limit=100_000))
    for run_id, args in runs.items():
        children = store.children(run_id)
        if not args.get("talk"):
            if children:
                report.violations.append(f"run {run_id} does not talk but started {len(children)} child run(s)")
            continue
        report.counts["talking"] += 1
        finished = store.get_run(run_id).status in (COMPLETED, STOPPED)
        if len(children) != 1 and (finished or len(children) > 1):
            report.violations.append(f"talking run {run_id} started {len(children)} child runs")
        report.counts["children"] += len(children)
        noted = notes[args["key"]]
        if noted != 1 and (finished or noted > 1):
            report.violations.append(f"talking run {run_id} scheduled {noted} detached runs from its body")
        for holder in [run_id, *(child.id for child in children)]:
            recorded = {step.step_id: step for step in store.get_steps(holder)}
            for message in store.messages(holder):
                if message.consumed_step is None:
                    if finished:
                        report.violations.append(f"message {message.id} to run {holder} was never consumed")
                    continue
                report.counts["messages_consumed"] += 1
                step = recorded.get(message.consumed_step)
                if step is None or step.name != "everystep.recv" or step.result != message.payload:
                    report.violations.append(f"message {message.id} to run {holder} consumed by step "
                                             f"{message.consumed_step}, which recorded {step!r}")
            consumers = [m.consumed_step for m in store.messages(holder) if m.consumed_step]
            if len(consumers) != len(set(consumers)):
                report.violations.append(f"run {holder}: one recv step consumed several messages {consumers}")


def run_chaos(config: ChaosConfig, workdir: Path) -> Report:
    rng = random.Random(config.seed)
    report = Report()
    server = start_server(env_var="EVERYSTEP_CHAOS_DATABASE_URL") if config.database is None \
        else PgServer(config.database)
    url = _prepare_database(server, config)
    bouncer = start_pgbouncer(server.admin_url, "transaction") if config.pooler else None
    if config.pooler and bouncer is None:
        raise RuntimeError("the chaos run through a pooler needs pgbouncer (apt-get install pgbouncer)")
    runner_url = bouncer.url_for(url) if bouncer is not None else url
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env[app.EFFECTS_ENV] = url
    env.pop("EVERYSTEP_DATABASE_URL", None)
    names = iter(f"chaos-{index}" for index in range(10_000))
    supervisors = [Supervisor(next(names), config, runner_url, workdir, env,
                              listen_url=url if bouncer is not None and index == 0 else None)
                   for index in range(config.supervisors)]
    try:
        feeder = Feeder(runner_url, _plan_runs(config, rng), spread=config.duration * 0.8)
        feeder.feed()
        looping = LoopFeeder(runner_url, config.loops, config.loop_messages, config.loop_every,
                             spread=config.duration * 0.8)
        looping.feed()
        for sup in supervisors:
            sup.start()
        faults = ["child"] * 4 + ["kill_same", "kill_new", "rollout"] * 1 + (["pg"] if server.owned else [])
        # Through a pooler, every other fault is one of PgBouncer's, in turn.
        pooler_faults = itertools.cycle(["pooler_reconnect", "pooler_kill", "pooler_restart"])
        dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        end = time.monotonic() + config.duration
        injected = 0
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.5, 1.5) * config.fault_every)
            for sup in supervisors:
                if not sup.alive:  # it could not start while the database was down
                    sup.start()
            fault = next(pooler_faults) if bouncer is not None and injected % 2 == 0 else rng.choice(faults)
            injected += 1
            _inject(fault, supervisors, server, rng, report, config, lambda: next(names), bouncer, str(dbname))
            feeder.feed()
            looping.feed()
        deadline = time.monotonic() + 120
        while (len(feeder.runs) < config.runs or feeder.unsent or not looping.done) and time.monotonic() < deadline:
            feeder.feed(everything=True)
            looping.feed(everything=True)
            time.sleep(0.5)
        runs = feeder.runs
        report.counts["runs"] = len(runs)
        if len(runs) < config.runs:
            report.violations.append(f"only {len(runs)} of {config.runs} runs could be scheduled")
        if not looping.done:
            report.violations.append(f"the looping runs could not be sent every message: {dict(looping.sent)}")
        settle_until = time.monotonic() + config.settle_timeout
        if not _wait_settled(url, supervisors, settle_until):
            report.violations.append("runs did not settle before the deadline")
        _resolve_blocked(url, runs, report)
        if not _wait_settled(url, supervisors, settle_until + 60):
            report.violations.append("runs did not settle after resolving blocked runs")
        for sup in supervisors:
            if not sup.wait_ready(120):
                report.violations.append(f"supervisor {sup.name} never answered on its control socket")
            code = sup.terminate(config.drain + 30)
            if code != 0:
                report.violations.append(f"supervisor {sup.name} stopped with exit code {code}")
        _verify(url, runs, report)
        verify_loops(url, looping, report.counts, report.violations)
    finally:
        for sup in supervisors:
            sup.kill()
            sup.reap_orphans()
        if bouncer is not None:
            bouncer.close()
        try:
            server.drop_database(url)
        finally:
            if server.owned:
                server.close()
    return report


def config_with(**overrides: object) -> ChaosConfig:
    return dataclasses.replace(ChaosConfig(), **overrides)
