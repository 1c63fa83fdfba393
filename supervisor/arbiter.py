"""The supervisor parent: a single-threaded event loop over selectors.

The parent claims runs (never more than it has idle children), hands each to
a forked child over a socketpair, and watches: the signal wake-up pipe, the
children's channels (an EOF is a death), the control socket and, on
PostgreSQL, a LISTEN connection that makes a newly committed run claimable
within milliseconds. It never runs workflow code.

Signal handlers only append to a queue (``signal.set_wakeup_fd`` wakes the
select); reaping, logging and database writes happen in the loop. Every
deadline uses ``time.monotonic()``.

Fork safety: before forking, the parent closes its pooled database
connections and its LISTEN connection, so no child can inherit a live
psycopg connection (and finalize it, which would terminate the parent's
session). They reopen lazily afterwards, and a claim follows at once in case
a notification arrived while LISTEN was closed.

What a child's death means depends on why it died:
- step timeout: the step is recorded failed with ``StepTimeout`` (not for an
  unsafe-to-repeat step: its ``started`` row stays, so the run goes
  ``blocked`` on replay) and the run goes to a fresh child;
- ``ctl kill``: the same with ``StepKilled``, or a plain requeue;
- drain deadline or fast stop: the run is requeued;
- anything else is a crash: the run is re-dispatched, and ends ``failed``
  after ``--max-crashes`` deaths.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import logging
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

from everystep import exposition, metrics, registry, sentry, serde, traces
from everystep.errors import ChildCrashed, EverystepError, StepKilled, StepTimeout, StoreUnavailable
from everystep.lease import Lease
from everystep.models import FAILED, STEP_FAILED, TERMINAL_STATUSES, Run
from everystep.outage import OutageLog
from everystep.store import Store, close_default_stores, utcnow

from . import child as child_process
from . import reporting, titles
from .children import (
    BOOTING,
    BUSY,
    FINISHING,
    IDLE,
    KILLED,
    RETIRING,
    Child,
    StepInFlight,
    describe_exit,
)
from .config import MAX_PROCS, Config
from .control import ControlServer, ControlSocketError
from .http import LoopHTTPServer
from .listener import Listener
from .protocol import Channel, ChannelClosed
from .sdnotify import Notifier
from .stepboard import StepBoard

logger = logging.getLogger("everystep.supervisor")

MAX_BOOT_FAILURES = 5
RECONCILE_EVERY = 5.0
PROGRESS_EVERY = 2.0
STATUS_EVERY = 5.0
CONTROL_SWEEP_EVERY = 1.0

_HANDLED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP,
    signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)


class Arbiter:
    def __init__(self, config: Config, store: Store, notifier: Notifier | None = None) -> None:
        self.config = config
        self.store = store
        self.notifier = notifier or Notifier(None)
        self.name = config.name
        self.procs = config.procs
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, Child] = {}
        self.ready: collections.deque[Run] = collections.deque()
        self.crashes: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self.restarts: collections.Counter[str] = collections.Counter()
        self.stopping: str | None = None
        self.drain_deadline: float | None = None
        self.exit_code = 0
        self.started = time.monotonic()
        self._signals: collections.deque[int] = collections.deque()
        self._claim_due = True
        self._next_poll = 0.0
        self._next_reconcile = 0.0
        self._caught_up = False
        self._boot_failures = 0
        self._reload_requested = False
        self._wake_r = self._wake_w = -1
        self._last_progress = 0.0
        self._last_progress_line = ""
        self._last_status = 0.0
        self._last_sweep = 0.0
        self._names: list[str] = registry.workflow_names()
        self.control = ControlServer(config.socket, self.handle_request, self.selector,
                                     on_request=self._count_request)
        self.http: LoopHTTPServer | None = None
        self.lease = Lease(store, config.name, "supervisor", config.lease)
        self.listener = Listener(store, self.selector, self._wake_claims, f"everystep-supervisor {config.name}")
        self._claims_outage = OutageLog(logger, f"everystep-supervisor {config.name}", "claiming")

    # -- setup / teardown -----------------------------------------------------------

    def run(self) -> int:
        """Supervise until stopped; returns the process exit code."""
        titles.master(self.name)
        self._install_signals()
        self.control.open()
        try:
            self._open_metrics()
            self.lease.tick(time.monotonic())  # register before catching up
            self.listener.open()
            self._catchup()
            self._spawn_missing()
            self.notifier.ready(reporting.status_line(self))
            logger.info(
                "everystep-supervisor %s: master pid %d, %d children, %s, control socket %s",
                self.name, os.getpid(), self.procs, self.store.describe(), self.config.socket,
            )
            if not self._names:
                logger.warning("everystep-supervisor %s: no workflows registered (did you pass --app?)", self.name)
            while not (self.stopping and not self.children):
                self._tick()
        finally:
            self._teardown()
        return self.exit_code

    def _open_metrics(self) -> None:
        metrics.runner_started(self.name, self.procs)
        if not self.config.metrics_port:
            return
        try:
            self.http = LoopHTTPServer(self.config.metrics_bind, self.config.metrics_port, self.selector,
                                       self._respond_http)
        except OSError as exc:
            raise ControlSocketError(
                f"cannot serve metrics on {self.config.metrics_bind}:{self.config.metrics_port}: {exc.strerror or exc}"
            ) from None
        logger.info("everystep-supervisor %s: metrics on http://%s:%d/metrics", self.name,
                    self.config.metrics_bind, self.http.port)

    def _respond_http(self, path: str) -> tuple[int, str, bytes]:
        self._gauge_children()  # gauges of the process tree are read when scraped
        return exposition.respond(path, self.store)

    def _count_request(self, command: str) -> None:
        label = metrics.control_command_label(command)
        metrics.record(lambda m: m.control_requests.labels(self.name, label).inc())

    def _gauge_children(self) -> None:
        alive = len(self.children)
        busy = sum(1 for kid in self.children.values() if kid.run is not None)
        metrics.record(lambda m: (m.children.labels(self.name).set(alive), m.inflight.labels(self.name).set(busy),
                                m.pool_size.labels(self.name).set(self.procs)))

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in _HANDLED_SIGNALS:
            signal.signal(sig, self._on_signal)
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._on_wakeup)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signals.append(signum)  # only record: the loop does the work

    def _on_wakeup(self, mask: int) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _teardown(self) -> None:
        for kid in list(self.children.values()):
            kid.kill("shutdown")
        self._reap(block=True)
        if self.stopping:
            try:
                leftover = self.store.requeue_all(self.name)
            except EverystepError as exc:
                leftover = []
                logger.error("everystep-supervisor %s: final requeue failed: %s", self.name, exc)
            if leftover:
                logger.warning("everystep-supervisor %s: requeued %d run(s) still claimed at exit", self.name, len(leftover))
        self.listener.close()
        self.lease.release()
        self.control.close()
        if self.http is not None:
            self.http.close()
        signal.set_wakeup_fd(-1)
        for sig in _HANDLED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        self.selector.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self.store.close()
        self.notifier.stopping()
        if self.config.show_progress:
            logger.info("everystep-supervisor %s: %s", self.name, reporting.summary_line(self))

    # -- the loop -----------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        for key, mask in self.selector.select(self._timeout(now)):
            key.data(mask)
        self._handle_signals()
        self._reap()
        now = time.monotonic()
        self._enforce_deadlines(now)
        if self._reload_requested:
            self._reload_requested = False
            self._reload()
        self._keep_lease(now)
        if now >= self._next_reconcile and not self.stopping:
            self._catchup()
        self._spawn_missing()
        if not self.stopping and self.listener.maintain(now):
            self._claim_due = True
        self._dispatch(now)
        self._periodic(now)

    def _keep_lease(self, now: float) -> None:
        """Heartbeat; requeue the runs of runners that missed their lease."""
        if self.stopping:
            return
        if self.lease.tick(now):
            self._claim_due = True  # recovered runs are claimable now
        if self.lease.lost_name:
            self.exit_code = 1
            self.begin_drain()

    def _timeout(self, now: float) -> float:
        candidates = [max(self._next_poll - now, 0.0), 1.0, max(self.lease.next_due() - now, 0.0)]
        if self._claim_due and self._idle_children() and not self.stopping:
            candidates.append(0.0)
        for kid in self.children.values():
            for step in kid.steps.values():
                if step.timeout is not None:
                    candidates.append(max(step.started + step.timeout - now, 0.0))
        if self.drain_deadline is not None:
            candidates.append(max(self.drain_deadline - now, 0.0))
        until_watchdog = self.notifier.seconds_until_watchdog(now)
        if until_watchdog is not None:
            candidates.append(until_watchdog)
        if self._signals:
            candidates.append(0.0)
        return min(candidates)

    def _handle_signals(self) -> None:
        while self._signals:
            sig = self._signals.popleft()
            if sig in (signal.SIGTERM, signal.SIGINT):
                logger.info("everystep-supervisor %s: %s received, draining", self.name, signal.Signals(sig).name)
                self.begin_drain()
            elif sig == signal.SIGQUIT:
                logger.info("everystep-supervisor %s: SIGQUIT received, fast stop", self.name)
                self.fast_stop()
            elif sig == signal.SIGHUP:
                logger.info("everystep-supervisor %s: SIGHUP received, reloading", self.name)
                self.request_reload()
            elif sig == signal.SIGTTIN:
                self.scale(self.procs + 1)
            elif sig == signal.SIGTTOU:
                self.scale(max(self.procs - 1, 0))
            # SIGCHLD: reaping happens every tick anyway.

    def _periodic(self, now: float) -> None:
        self.notifier.maybe_watchdog(now)
        if now - self._last_sweep >= CONTROL_SWEEP_EVERY:
            self._last_sweep = now
            self.control.sweep(now)
            if self.http is not None:
                self.http.sweep(now)
            self._gauge_children()
        if now - self._last_status >= STATUS_EVERY:
            self._last_status = now
            self.notifier.status(reporting.status_line(self))
        if self.config.show_progress and now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            self._log_progress()
        self._check_burst()

    # -- children -----------------------------------------------------------------

    def _idle_children(self) -> list[Child]:
        """Children that can take a run now: idle, or finishing one (the run
        waits in the channel until the terminal write is done)."""
        return [kid for kid in self.children.values() if kid.state in (IDLE, FINISHING)]

    def _active_children(self) -> list[Child]:
        return [kid for kid in self.children.values() if kid.active]

    def _spawn_missing(self) -> None:
        if self.stopping:
            return
        missing = self.procs - len(self._active_children())
        if missing <= 0:
            self._retire_extra()
            return
        if self._boot_failures >= MAX_BOOT_FAILURES:
            return
        self._before_fork()
        try:
            for _ in range(missing):
                self._spawn_one()
        finally:
            self._after_fork()

    def _before_fork(self) -> None:
        self.store.close()
        close_default_stores()
        self.listener.close()

    def _after_fork(self) -> None:
        if not self.stopping:
            self.listener.open()
        self._claim_due = True  # a notification may have come while LISTEN was closed

    def _free_slot(self) -> int:
        used = {kid.slot for kid in self.children.values()}
        slot = 1
        while slot in used:
            slot += 1
        return slot

    def _spawn_one(self) -> None:
        slot = self._free_slot()
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        inherited = self._inherited_fds() + [parent_sock.fileno()]
        board = StepBoard()
        spec = child_process.ChildSpec(
            slot=slot, name=self.name, database=self.store.url, parent_pid=os.getpid(),
            max_runs=self.config.max_runs_per_child, max_memory_mb=self.config.max_memory_per_child,
            drain=self.config.drain, step_timeout=self.config.step_timeout, board=board,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            child_process.main(spec, Channel(child_sock), inherited)
        child_sock.close()
        try:
            os.setpgid(pid, pid)  # also done by the child: whoever runs first wins
        except OSError:
            pass
        parent_sock.setblocking(False)
        kid = Child(slot=slot, pid=pid, channel=Channel(parent_sock), spawned=time.monotonic(), board=board)
        self.children[pid] = kid
        self.selector.register(parent_sock, selectors.EVENT_READ, lambda mask, k=kid: self._on_child(k))
        logger.info("everystep-supervisor %s: child %d started (pid %d)", self.name, slot, pid,
                    extra={"child_pid": pid, "event": "child_started"})

    def _inherited_fds(self) -> list[int]:
        fds = [self._wake_r, self._wake_w, self.notifier.fileno()]
        if isinstance(self.selector, selectors.EpollSelector):
            fds.append(self.selector.fileno())
        fds += self.control.fds()
        if self.http is not None:
            fds += self.http.fds()
        fds += [kid.channel.fileno() for kid in self.children.values() if kid.channel_open]
        return [fd for fd in fds if fd >= 0]

    def _retire_extra(self) -> None:
        """Scale down: idle children leave now, busy ones after their run."""
        extra = len(self._active_children()) - self.procs
        if extra <= 0:
            return
        ordered = sorted(self._active_children(), key=lambda kid: (kid.state in (BUSY, FINISHING), -kid.slot))
        for kid in ordered[:extra]:
            if kid.state in (BUSY, FINISHING):
                kid.state = RETIRING
            else:
                self._ask_exit(kid, "scale")

    def _ask_exit(self, kid: Child, reason: str) -> None:
        kid.state = RETIRING
        try:
            kid.channel.send({"op": "exit", "reason": reason}, timeout=1.0)
        except ChannelClosed:
            kid.kill(reason)

    def _on_child(self, kid: Child) -> None:
        messages, closed = kid.channel.read_available()
        for message in messages:
            self._on_message(kid, message)
        if closed:
            self._close_channel(kid)

    def _close_channel(self, kid: Child) -> None:
        if kid.channel_open:
            kid.channel_open = False
            try:
                self.selector.unregister(kid.channel.sock)
            except (KeyError, ValueError):
                pass
            kid.channel.close()

    def _on_message(self, kid: Child, message: dict[str, Any]) -> None:
        event = message.get("ev")
        now = time.monotonic()
        if event == "ready":
            self._boot_failures = 0
            if kid.state == BOOTING:
                kid.state = IDLE
        elif event == "step" and kid.run is not None and message.get("run") == kid.run.id:
            timeout = message.get("timeout")
            kid.steps[message["step"]] = StepInFlight(
                step_id=message["step"], name=message.get("name", ""), started=now,
                timeout=float(timeout) if timeout else None, unsafe=bool(message.get("unsafe")),
            )
        elif event == "step_end":
            kid.steps.pop(message.get("step"), None)
        elif event == "finishing":
            if kid.state == BUSY and kid.run is not None and message.get("run") == kid.run.id:
                kid.state = FINISHING
                kid.steps.clear()
        elif event == "done":
            self._run_done(kid, message)
        elif event == "bye":
            kid.bye_reason = kid.bye_reason or message.get("reason")
            if kid.active:
                kid.state = RETIRING

    def _run_done(self, kid: Child, message: dict[str, Any]) -> None:
        finished_early = kid.finishing_run is not None and message.get("run") == kid.finishing_run.id
        run = kid.finishing_run if finished_early else kid.run
        if run is None or message.get("run") != run.id:
            return
        status = str(message.get("status"))
        kid.rss = int(message.get("rss") or 0) or kid.rss
        kid.runs_done += 1
        if finished_early:
            kid.finishing_run = None  # ``kid.run`` is its next run, already handed over
        else:
            kid.run = None
            kid.run_started = None
            kid.steps.clear()
        self.counts[status] += 1
        if status in TERMINAL_STATUSES or status == "requeued":
            self.crashes.pop(run.id, None)
        if status == "unfinished":
            self._redispatch(run)  # still ours: the database blinked, replay recovers
        elif status == "requeued":
            metrics.record(lambda m: m.requeued.labels(self.name).inc())
        logger.info("everystep-supervisor %s: run %s (%s) %s in child %d (pid %d)",
                    self.name, run.id, run.name, status, kid.slot, kid.pid,
                    extra={"run_id": run.id, "workflow": run.name, "child_pid": kid.pid, "event": "run_" + status})
        self._claim_due = True
        if finished_early:
            return
        if kid.state in (BUSY, FINISHING):
            kid.state = IDLE
        elif kid.state == RETIRING and kid.bye_reason is None:
            self._ask_exit(kid, "scale")

    # -- reaping ------------------------------------------------------------------

    def _reap(self, block: bool = False) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            kid = self.children.pop(pid, None)
            if kid is not None:
                metrics.mark_process_dead(pid)
                try:
                    self._on_exit(kid, status)
                finally:
                    if kid.board is not None:
                        kid.board.close()
                self._gauge_children()

    def _on_exit(self, kid: Child, status: int) -> None:
        if kid.channel_open:
            self._on_child(kid)  # messages sent just before exiting
            self._close_channel(kid)
        how, signalled = describe_exit(status)
        if kid.finishing_run is not None:
            # It died settling one run with the next one still unread in its
            # channel: that one never started, the settling one is the victim.
            self._redispatch(kid.run)
            kid.run, kid.finishing_run = kid.finishing_run, None
        run = kid.run
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == child_process.BOOT_ERROR and kid.runs_done == 0:
            self._boot_failures += 1
            logger.error("everystep-supervisor %s: child %d failed to boot (%d in a row)",
                         self.name, kid.slot, self._boot_failures)
            if self._boot_failures >= MAX_BOOT_FAILURES and not self.stopping:
                logger.error("everystep-supervisor %s: children keep failing to boot; stopping", self.name)
                self.exit_code = 1
                self.begin_drain()
        reason = self._restart_reason(kid, run)
        if not self.stopping:
            self.restarts[reason] += 1  # a replacement is spawned
            metrics.record(lambda m: m.child_restarts.labels(self.name, reason).inc())
        level = logging.WARNING if reason == "crash" else logging.INFO
        logger.log(level, "everystep-supervisor %s: child %d (pid %d) %s%s", self.name, kid.slot, kid.pid, how,
                   f" while running {run.id} ({run.name})" if run else "",
                   extra={"child_pid": kid.pid, "run_id": run.id if run else None, "event": "child_exit"})
        if run is not None:
            clean_exit = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            self._recover_run(kid, run, how, clean_exit)

    @staticmethod
    def _restart_reason(kid: Child, run: Run | None) -> str:
        if kid.kill_reason == "timeout":
            return "timeout"
        if kid.kill_reason in ("kill", "kill-requeue"):
            return "kill"
        if kid.kill_reason is not None:
            return "exit"
        if kid.bye_reason in ("max-runs", "max-memory", "reload"):
            return "recycle"
        if kid.bye_reason is not None and run is None:
            return "exit"
        return "crash"

    def _recover_run(self, kid: Child, run: Run, how: str, clean_exit: bool) -> None:
        """Decide what happens to the run a dead child was executing."""
        reason = kid.kill_reason
        try:
            if reason is None and kid.bye_reason is not None and clean_exit:
                # It said goodbye before our run message reached it: the run
                # never started there, so this is no crash of the run.
                self._redispatch(run)
            elif reason == "timeout":
                for step in kid.overdue_steps:
                    if not step.unsafe:
                        self._fail_step(run, step.step_id, step.name, StepTimeout(
                            f"step {step.step_id} ({step.name}) ran past its timeout of {step.timeout:g}s "
                            f"and its process (pid {kid.pid}) was killed"))
                self._redispatch(run)
            elif reason == "kill":
                in_flight = kid.in_flight()
                for step in in_flight:
                    if not step.get("unsafe"):
                        self._fail_step(run, step["step"], step["name"], StepKilled(
                            f"step {step['step']} ({step['name']}) was killed by an operator (pid {kid.pid})"))
                if in_flight:
                    self._redispatch(run)
                else:
                    self._finish_failed(run, StepKilled(f"run {run.id} was killed by an operator between steps"))
            elif reason is not None or self.stopping:
                self._requeue(run)
            else:
                self.crashes[run.id] += 1
                if self.crashes[run.id] >= self.config.max_crashes:
                    self.crashes.pop(run.id, None)
                    self._finish_failed(run, ChildCrashed(
                        f"the process running this run died {self.config.max_crashes} times; "
                        f"last: {how}"))
                else:
                    self._redispatch(run)
        except StoreUnavailable as exc:
            logger.warning("everystep-supervisor %s: cannot record what happened to run %s (%s); retrying it",
                           self.name, run.id, exc)
            self._redispatch(run)

    def _redispatch(self, run: Run) -> None:
        if self.stopping:
            self._requeue(run)
        else:
            # It may have recorded steps since it was claimed: the next child
            # must read them rather than trust the claim-time answer.
            self.ready.appendleft(dataclasses.replace(run, has_steps=None))

    def _requeue(self, run: Run) -> None:
        try:
            if self.store.requeue(run.id, self.name):
                self.counts["requeued"] += 1
                metrics.record(lambda m: m.requeued.labels(self.name).inc())
        except StoreUnavailable as exc:
            logger.error("everystep-supervisor %s: could not requeue run %s: %s", self.name, run.id, exc)

    def _fail_step(self, run: Run, step_id: str, step_name: str, exc: BaseException) -> None:
        error = serde.dumps(serde.encode_exception(exc), "step error")
        write = self.store.record_step(run.id, self.name, step_id, step_name, None, None,
                                       STEP_FAILED, None, error, utcnow())
        if write is not None and write.ours:
            metrics.record(lambda m: m.step_runs.labels(run.name, step_name, STEP_FAILED).inc())

    def _finish_failed(self, run: Run, exc: BaseException) -> None:
        error = serde.dumps(serde.encode_exception(exc), "run error")
        if self.store.finish_run(run.id, self.name, FAILED, None, error):
            self.counts[FAILED] += 1
            metrics.record(lambda m: m.workflow_runs.labels(run.name, FAILED).inc())
            sentry.report_failure(exc, run.id, run.name, runner=self.name)
            # Warning, not error: it is reported to Sentry explicitly above, and
            # Sentry's logging integration would report an error line again.
            logger.warning("everystep-supervisor %s: run %s (%s) failed: %s", self.name, run.id, run.name, exc,
                         extra={"run_id": run.id, "workflow": run.name, "event": "run_failed"})

    # -- deadlines ------------------------------------------------------------------

    def _enforce_deadlines(self, now: float) -> None:
        for kid in list(self.children.values()):
            if kid.state == KILLED:
                continue
            overdue = [step for step in kid.steps.values() if step.overdue(now)]
            if overdue:
                kid.overdue_steps = overdue
                logger.warning("everystep-supervisor %s: step %s of run %s exceeded its timeout; killing child %d (pid %d)",
                               self.name, overdue[0].step_id, kid.run.id if kid.run else "?", kid.slot, kid.pid)
                kid.kill("timeout")
                metrics.record(lambda m: m.step_timeouts.labels(self.name).inc(len(overdue)))
        if self.drain_deadline is not None and now >= self.drain_deadline:
            self.drain_deadline = None
            left = [kid for kid in self.children.values() if kid.state != KILLED]
            if left:
                logger.warning("everystep-supervisor %s: drain deadline passed; killing %d child(ren) and requeueing their runs",
                               self.name, len(left))
            for kid in left:
                kid.kill("drain-deadline")

    # -- claiming and dispatch --------------------------------------------------------

    def _catchup(self) -> None:
        """Runs held under this name that nothing here is executing.

        At startup: what a previous incarnation left running. Afterwards,
        every ``RECONCILE_EVERY`` seconds: claims and terminal writes commit
        asynchronously, so a database crash can roll a finished run back to
        ``running`` under our name; this resumes it (replay writes the same
        outcome again) instead of leaving it claimed while we live.
        """
        self._next_reconcile = time.monotonic() + RECONCILE_EVERY
        held = [run.id for run in self.ready]
        for kid in self.children.values():
            held += [run.id for run in (kid.run, kid.finishing_run) if run is not None]
        try:
            runs = self.store.claim_own(self.name, 100_000, self._names, exclude=held)
        except EverystepError as exc:
            logger.warning("everystep-supervisor %s: catchup failed: %s", self.name, exc)
            return
        if runs and not self._caught_up:
            logger.info("everystep-supervisor %s: resuming %d run(s) left running under this name",
                        self.name, len(runs))
        elif runs:
            logger.warning("everystep-supervisor %s: resuming %d run(s) held under this name that no child "
                           "was executing (a write lost in a database crash?)", self.name, len(runs))
        self._caught_up = True
        self.ready.extend(runs)

    def _dispatch(self, now: float) -> None:
        if self.stopping:
            return
        idle = self._idle_children()
        while idle and self.ready:
            self._give(idle.pop(), self.ready.popleft())
        if not idle:
            return
        if now >= self._next_poll:
            self._claim_due = True
        if not self._claim_due:
            return
        try:
            runs = self.store.claim(self.name, len(idle), self._names)
        except EverystepError as exc:
            self._claims_outage.failed(exc)
            runs = []
            self._claim_due = False
            self._next_poll = now + max(self.config.poll, 1.0)
            return
        self._claims_outage.ok()
        self._claim_due = len(runs) == len(idle)
        self._next_poll = now + self.config.poll
        self.counts["claimed"] += len(runs)
        if runs:
            metrics.record(lambda m: m.claims.labels(self.name).inc(len(runs)))
        else:  # contention among supervisors shows here (ctl status, metrics)
            self.counts["empty_claims"] += 1
            metrics.record(lambda m: m.empty_claims.labels(self.name).inc())
        for run in runs:
            self._give(idle.pop(), run)

    def _give(self, kid: Child, run: Run) -> None:
        if kid.state == FINISHING:
            kid.finishing_run = kid.run
        try:
            with traces.dispatch_span(run):
                kid.channel.send({"op": "run", "run": child_process.run_to_message(run), "trace": traces.inject()})
        except ChannelClosed:
            self.ready.appendleft(run)
            kid.run, kid.finishing_run = kid.finishing_run or kid.run, None
            kid.kill("unreachable")
            return
        kid.state = BUSY
        kid.run = run
        kid.run_started = time.monotonic()
        kid.steps.clear()

    def _wake_claims(self) -> None:
        self._claim_due = True

    # -- operator actions ---------------------------------------------------------------

    def begin_drain(self) -> None:
        if self.stopping:
            return
        self.stopping = "drain"
        self.drain_deadline = time.monotonic() + self.config.drain if self.config.drain > 0 else None
        titles.master(self.name, "draining")
        self.notifier.stopping()
        self.listener.close()
        while self.ready:
            self._requeue(self.ready.popleft())
        for kid in list(self.children.values()):
            if kid.state in (IDLE, BOOTING):
                self._ask_exit(kid, "drain")
            if kid.state != KILLED:
                kid.terminate()

    def fast_stop(self) -> None:
        if self.stopping != "drain":
            self.begin_drain()
        self.stopping = "quit"
        for kid in list(self.children.values()):
            kid.kill("quit")

    def scale(self, procs: int) -> None:
        procs = max(0, min(procs, MAX_PROCS))
        if procs != self.procs:
            logger.info("everystep-supervisor %s: scaling from %d to %d children", self.name, self.procs, procs)
        self.procs = procs
        self._retire_extra()

    def _reload(self) -> None:
        """HUP: re-import the app modules, then replace every child."""
        if self.stopping:
            return
        self.notifier.reloading()
        for module in self.config.app:
            try:
                importlib.reload(sys.modules[module]) if module in sys.modules else importlib.import_module(module)
            except Exception:
                logger.exception("everystep-supervisor %s: reload of %s failed; keeping the running code", self.name, module)
                self.notifier.ready(reporting.status_line(self))
                return
        self._names = registry.workflow_names()
        for kid in list(self.children.values()):
            if kid.state in (IDLE, BOOTING):
                self._ask_exit(kid, "reload")
            elif kid.state in (BUSY, FINISHING, RETIRING):
                kid.bye_reason = kid.bye_reason or "reload"
                kid.terminate()
        self.notifier.ready(reporting.status_line(self))

    def request_reload(self) -> None:
        self._reload_requested = True

    def kill_run(self, run_id: str, requeue: bool) -> Child | None:
        for kid in self.children.values():
            if kid.finishing_run is not None:
                continue  # its ``run`` is queued, not executing yet
            if kid.run is not None and kid.run.id == run_id and kid.state != KILLED:
                kid.kill("kill-requeue" if requeue else "kill")
                return kid
        return None

    # -- control requests -----------------------------------------------------------------

    def handle_request(self, request: dict[str, Any]) -> dict[str, Any]:
        from .commands import handle

        return handle(self, request)

    def status(self) -> dict[str, Any]:
        return reporting.status(self)

    # -- progress, burst ------------------------------------------------------------------

    def _log_progress(self) -> None:
        try:
            queued: int | None = self.store.count_scheduled(self._names)
        except EverystepError:
            queued = None
        line = reporting.progress_line(self, queued)
        if line != self._last_progress_line:
            self._last_progress_line = line
            logger.info("everystep-supervisor %s: %s", self.name, line)

    def _check_burst(self) -> None:
        if not self.config.burst or self.stopping or self.ready or self._claim_due:
            return
        kids = list(self.children.values())
        if self.procs > 0 and (not kids or any(kid.state != IDLE for kid in kids)):
            return
        logger.info("everystep-supervisor %s: burst mode: nothing left to run", self.name)
        self.begin_drain()
