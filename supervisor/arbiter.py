"""The supervisor parent: process management around a single-threaded loop.

The arbiter forks children, hands each a run at a time, and watches, in one
``select``: the signal wake-up pipe, the children's channels (an EOF is a
death), the control socket, the metrics port and, on PostgreSQL, a LISTEN
connection that makes a newly committed run claimable within milliseconds.
It never runs workflow code, and it never waits on one thing: it writes to
children without blocking (a child that stops reading is killed as
unresponsive), and its database connections carry a statement timeout, so
no child's step deadline is ever enforced late because of another.

What it does not decide itself: where runs come from (``ClaimLoop``, shared
with the threaded worker), what becomes of a run whose child died
(``fate.decide``, a pure function), how outcomes are written
(``everystep.outcomes``), what the messages look like (``protocol``).

Fork safety: before forking, the parent closes its pooled database
connections and its LISTEN connection (and calls ``Config.before_fork``
hooks), so no child can inherit a live connection and finalize it, which
would terminate the parent's session. They reopen lazily afterwards, and a
claim follows at once in case a notification arrived while LISTEN was
closed. Every deadline uses ``time.monotonic()``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import selectors
import signal
import socket
import sys
import time

from everystep import exposition, metrics, outcomes, traces
from everystep.claimloop import ClaimLoop
from everystep.errors import EverystepError, StoreUnavailable
from everystep.models import TERMINAL_STATUSES, Run
from everystep.resources import describe
from everystep.runner import Outcome
from everystep.store import Store, close_default_stores
from everystep.store.postgres import FENCE_CHANNEL

from . import child as child_process
from . import reporting, titles
from .budgets import Budgets
from .children import Child, describe_exit
from .config import MAX_PROCS, Config
from .control import ControlServer, ControlSocketError
from .fate import Action, ChildEnd, Decision, decide, restart_reason
from .fencing import FenceWatch, older_executions
from .http import LoopHTTPServer
from .listener import Listener
from .protocol import (
    Bye,
    Channel,
    ChannelClosed,
    Dispatch,
    Done,
    ErrorReply,
    Exit,
    Finishing,
    Message,
    Ready,
    ReloadReply,
    Reply,
    Request,
    StepEnded,
    StepStarted,
)
from .reload import ReloadFailed, reimport
from .remote import REQUEST_CHANNEL, RemoteControl
from .sdnotify import Notifier
from .signals import SignalQueue
from .states import ByeReason, ChildState, KillReason, StopMode
from .stepboard import StepBoard

logger = logging.getLogger("everystep.supervisor")

MAX_BOOT_FAILURES = 5
PROGRESS_EVERY = 2.0
STATUS_EVERY = 5.0
SWEEP_EVERY = 1.0


class Arbiter:
    def __init__(self, config: Config, store: Store, notifier: Notifier | None = None) -> None:
        self.config = config
        self.store = store
        self.notifier = notifier or Notifier(None)
        self.name = config.name
        self.procs = config.procs
        self.who = f"everystep-supervisor {config.name}"
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, Child] = {}
        self.ready: collections.deque[Run] = collections.deque()  # claimed, waiting for a child
        self.crashes: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self.restarts: collections.Counter[str] = collections.Counter()
        self.stopping: StopMode | None = None
        self.drain_deadline: float | None = None
        self.exit_code = 0
        self.started = time.monotonic()
        self.signals = SignalQueue()
        self.loop = ClaimLoop(store, config.name, "supervisor", lease=config.lease, poll=config.poll,
                              takeover=config.takeover, logger=logger, who=self.who, queues=config.queues)
        self.control = ControlServer(config.socket, self.handle_request, self.selector,
                                     idle_timeout=config.control_timeout, on_request=self._count_request)
        self.listener = Listener(store, self.selector, self._on_notify, self.who, outage=self.loop.outage)
        self.fences = FenceWatch(store, config.name, self.loop.lease.beat_every)
        self.remote = RemoteControl(store, config.name, self.loop.lease.instance, self.handle_request,
                                    outage=self.loop.outage)
        self.budgets = Budgets(self.who, config.cgroups, config.step_memory_limit, config.step_cpu_limit)
        self.http: LoopHTTPServer | None = None
        self._boot_failures = 0
        self._reload_requested = False
        self._last_progress = 0.0
        self._last_progress_line = ""
        self._last_status = 0.0
        self._last_sweep = 0.0

    # -- running -------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until stopped; returns the process exit code."""
        titles.master(self.name)
        self.loop.start(self.procs)  # NameInUse: never under a live runner's name
        try:
            self.control.open()
        except BaseException:
            self.loop.stop()
            raise
        self.signals.install(self.selector)
        try:
            self._open_metrics()
            self.listener.open()
            self.budgets.open()
            self._spawn_missing()
            self.notifier.ready(reporting.status_line(self))
            logger.info("%s: master pid %d, %s, %s, control socket %s", self.who, os.getpid(),
                        reporting.plural(self.procs, "child", "children"), self.store.describe(),
                        self.config.socket)
            while not (self.stopping and not self.children):
                self._tick()
        finally:
            self._teardown()
        logger.info("%s: stopped (exit code %d)", self.who, self.exit_code)
        return self.exit_code

    def _open_metrics(self) -> None:
        if not self.config.metrics_port:
            return
        try:
            self.http = LoopHTTPServer(self.config.metrics_bind, self.config.metrics_port, self.selector,
                                       self._respond_http)
        except OSError as exc:
            raise ControlSocketError(exposition.bind_error(self.config.metrics_bind, self.config.metrics_port,
                                                           exc)) from None
        logger.info("%s: metrics on http://%s:%d/metrics", self.who, self.config.metrics_bind, self.http.port)

    def _teardown(self) -> None:
        for kid in list(self.children.values()):
            kid.kill(KillReason.SHUTDOWN)
        self._reap(block=True)
        self.budgets.close()
        if self.stopping and self.loop.lease.still_ours():
            # Only while the name is still ours: after a takeover, what is
            # claimed under it belongs to the new holder.
            try:
                leftover = self.store.requeue_all(self.name)
            except EverystepError as exc:
                leftover = []
                logger.error("%s: final requeue failed: %s", self.who, exc)
            if leftover:
                logger.warning("%s: requeued %d run(s) still claimed at exit", self.who, len(leftover))
        self.listener.close()
        self.loop.stop()
        self.control.close()
        if self.http is not None:
            self.http.close()
        self.signals.uninstall(self.selector)
        self.selector.close()
        self.store.close()
        self.notifier.stopping()
        if self.config.show_progress:
            logger.info("%s: %s", self.who, reporting.summary_line(self))

    def _tick(self) -> None:
        now = time.monotonic()
        for key, mask in self.selector.select(self._timeout(now)):
            key.data(mask)
        self._handle_signals()
        self._reap()
        now = time.monotonic()
        self._enforce_deadlines(now)
        self._enforce_budgets(now)
        if self._reload_requested:
            self._reload_requested = False
            self.reload("SIGHUP")
        self._keep_lease(now)
        self.remote.tick(now)
        if now >= self.fences.next_at:
            self._check_fences(now)
        self._spawn_missing()
        if not self.stopping and self.listener.maintain(now):
            self.loop.wake()
            self.fences.wake()  # a fence notice may have been missed too
        self._dispatch(now)
        self._periodic(now)

    def _timeout(self, now: float) -> float:
        candidates = [1.0, max(self.fences.next_at - now, 0.0)]
        if not self.stopping:
            due = self.loop.next_due(now) if self._available() else self.loop.housekeeping_due(now)
            candidates.append(max(due - now, 0.0))
            if self.ready and self._available():
                candidates.append(0.0)
        for kid in self.children.values():
            for step in kid.timed_steps.values():
                if step.timeout is not None:
                    candidates.append(max(step.started + step.timeout - now, 0.0))
            if kid.channel.stalled_since is not None:
                candidates.append(max(kid.channel.stalled_since + self.config.stall_timeout - now, 0.0))
        budget_check = self.budgets.next_due(self.children.values(), now)
        if budget_check is not None:
            candidates.append(max(budget_check - now, 0.0))
        if self.drain_deadline is not None:
            candidates.append(max(self.drain_deadline - now, 0.0))
        until_watchdog = self.notifier.seconds_until_watchdog(now)
        if until_watchdog is not None:
            candidates.append(until_watchdog)
        if self.signals.waiting:
            candidates.append(0.0)
        return min(candidates)

    def _handle_signals(self) -> None:
        for sig in self.signals.pop_all():
            if sig == signal.SIGINT and self.stopping == StopMode.DRAIN:
                logger.warning("%s: SIGINT again, stopping now: killing children and requeueing their runs",
                               self.who)
                self.fast_stop()
            elif sig in (signal.SIGTERM, signal.SIGINT):
                hint = " (Ctrl-C again to stop at once)" if sig == signal.SIGINT else ""
                logger.info("%s: %s received, draining%s", self.who, signal.Signals(sig).name, hint)
                self.begin_drain()
            elif sig == signal.SIGQUIT:
                logger.info("%s: SIGQUIT received, fast stop", self.who)
                self.fast_stop()
            elif sig == signal.SIGHUP:
                logger.info("%s: SIGHUP received, reloading", self.who)
                self._reload_requested = True
            elif sig == signal.SIGTTIN:
                self.scale(self.procs + 1, "SIGTTIN")
            elif sig == signal.SIGTTOU:
                self.scale(max(self.procs - 1, 0), "SIGTTOU")
            # SIGCHLD: reaping happens every tick anyway.

    def _keep_lease(self, now: float) -> None:
        if self.stopping:
            return
        if not self.loop.keep_lease(now):
            self.exit_code = 1
            self.begin_drain()

    def _periodic(self, now: float) -> None:
        self.notifier.maybe_watchdog(now)
        if now - self._last_sweep >= SWEEP_EVERY:
            self._last_sweep = now
            self.control.sweep(now)
            if self.http is not None:
                self.http.sweep(now)
            self._gauge_children()
            self.budgets.sweep()
        if now - self._last_status >= STATUS_EVERY:
            self._last_status = now
            self.notifier.status(reporting.status_line(self))
        if self.config.show_progress and now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            self._log_progress()
        self._check_burst()

    # -- children -----------------------------------------------------------------

    def _available(self) -> list[Child]:
        """Children that can take a run now: idle, or finishing one (the run
        waits in the channel until the terminal write is done)."""
        return [kid for kid in self.children.values() if kid.state.available]

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
        for hook in self.config.before_fork:
            try:
                hook()
            except Exception:
                logger.exception("%s: before_fork hook %r failed", self.who, hook)

    def _after_fork(self) -> None:
        if not self.stopping:
            self.listener.open()
        self.loop.wake()  # a notification may have come while LISTEN was closed

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
        group = self.budgets.group_for(slot)
        spec = child_process.ChildSpec(
            slot=slot, name=self.name, database=self.store.url, parent_pid=os.getpid(),
            max_runs=self.config.max_runs_per_child, max_memory_mb=self.config.max_memory_per_child,
            drain=self.config.drain, step_timeout=self.config.step_timeout, board=board,
            step_memory_limit=self.config.step_memory_limit, step_cpu_limit=self.config.step_cpu_limit,
            cgroup=group,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            child_process.main(spec, Channel(child_sock, incoming=Dispatch.KEY), inherited)
        child_sock.close()
        try:
            os.setpgid(pid, pid)  # also done by the child: whoever runs first wins
        except OSError:
            pass
        parent_sock.setblocking(False)
        kid = Child(slot=slot, pid=pid, channel=Channel(parent_sock, incoming=Ready.KEY),
                    spawned=time.monotonic(), board=board, group=group)
        self.children[pid] = kid
        self.selector.register(parent_sock, selectors.EVENT_READ, lambda mask, k=kid: self._on_channel(k, mask))
        logger.info("%s: child %d started (pid %d)", self.who, slot, pid,
                    extra={"child_pid": pid, "event": "child_started"})

    def _inherited_fds(self) -> list[int]:
        fds = self.signals.fds() + [self.notifier.fileno()]
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
        busy = (ChildState.BUSY, ChildState.FINISHING)
        ordered = sorted(self._active_children(), key=lambda kid: (kid.state in busy, -kid.slot))
        for kid in ordered[:extra]:
            if kid.state in busy:
                kid.state = ChildState.RETIRING
            else:
                self._ask_exit(kid, ByeReason.SCALE)

    def _ask_exit(self, kid: Child, reason: ByeReason) -> None:
        kid.state = ChildState.RETIRING
        self._send(kid, Exit(reason))

    def _send(self, kid: Child, message: Message) -> bool:
        """Queue ``message`` for ``kid`` without blocking; False (and the
        child killed) if its channel is gone."""
        try:
            kid.channel.send(message)
        except ChannelClosed:
            kid.kill(KillReason.UNRESPONSIVE)
            return False
        self._watch_channel(kid)
        return True

    def _watch_channel(self, kid: Child) -> None:
        if not kid.channel_open:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if kid.channel.pending else 0)
        self.selector.modify(kid.channel.sock, events, lambda mask, k=kid: self._on_channel(k, mask))

    def _on_channel(self, kid: Child, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            try:
                kid.channel.flush()
            except ChannelClosed:
                pass  # the EOF on the read side says it
            if not kid.channel.pending:
                kid.delivered = True
                self._watch_channel(kid)
        if mask & selectors.EVENT_READ:
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

    def _on_message(self, kid: Child, message: Message) -> None:
        run = kid.run
        if isinstance(message, Ready):
            self._boot_failures = 0
            self.budgets.joined(kid, message.cgroup)
            if kid.state == ChildState.BOOTING:
                kid.state = ChildState.IDLE
        elif isinstance(message, StepStarted):
            if run is not None and message.step.run == run.id:
                kid.timed_steps[message.step.step] = message.step
        elif isinstance(message, StepEnded):
            kid.timed_steps.pop(message.step, None)
        elif isinstance(message, Finishing):
            if kid.state == ChildState.BUSY and run is not None and message.run == run.id:
                kid.state = ChildState.FINISHING
                kid.timed_steps.clear()
        elif isinstance(message, Done):
            self._run_done(kid, message)
        elif isinstance(message, Bye):
            kid.bye_reason = kid.bye_reason or _bye_reason(message.reason)
            if kid.active:
                kid.state = ChildState.RETIRING

    def _run_done(self, kid: Child, done: Done) -> None:
        finished_early = kid.finishing_run is not None and done.run == kid.finishing_run.id
        run = kid.finishing_run if finished_early else kid.run
        if run is None or done.run != run.id:
            return
        outcome = Outcome(done.outcome)
        kid.rss = done.rss or kid.rss
        kid.runs_done += 1
        if finished_early:
            kid.finishing_run = None  # ``kid.run`` is its next run, already handed over
        else:
            kid.run = None
            kid.run_started = None
            kid.timed_steps.clear()
        self.counts[outcome] += 1
        if outcome.settled:
            self.crashes.pop(run.id, None)
        if outcome == Outcome.UNFINISHED:
            self._redispatch(run)  # still ours: the database blinked, replay recovers
        outcomes.log_outcome(logger, self.who, run, outcome, f" in child {kid.slot} (pid {kid.pid})",
                             child_pid=kid.pid)
        self.loop.wake()
        if finished_early:
            return
        if kid.state in (ChildState.BUSY, ChildState.FINISHING):
            kid.state = ChildState.IDLE
        elif kid.state == ChildState.RETIRING and kid.bye_reason is None:
            self._ask_exit(kid, ByeReason.SCALE)

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
            self._on_channel(kid, selectors.EVENT_READ)  # messages sent just before exiting
            self._close_channel(kid)
        how, _ = describe_exit(status, kid.kill_reason)
        if kid.finishing_run is not None or not kid.delivered:
            # The run handed to it last never started there (it was still in
            # the channel, behind the one settling or not even delivered):
            # another child takes it; the settling one, if any, is the victim.
            if kid.run is not None:
                self._redispatch(kid.run)
            kid.run, kid.finishing_run = kid.finishing_run, None
        run = kid.run
        clean_exit = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == child_process.BOOT_ERROR and kid.runs_done == 0:
            self._boot_failures += 1
            logger.error("%s: child %d failed to boot (%d in a row)", self.who, kid.slot, self._boot_failures)
            if self._boot_failures >= MAX_BOOT_FAILURES and not self.stopping:
                logger.error("%s: children keep failing to boot; stopping", self.who)
                self.exit_code = 1
                self.begin_drain()
        steps = kid.overdue_steps if kid.kill_reason == KillReason.TIMEOUT else kid.in_flight()
        overrun = self.budgets.ended(kid, status, steps)
        if overrun is not None and kid.kill_reason is None:
            how = "killed by SIGKILL (the kernel's out-of-memory killer)"
        reason = restart_reason(kid.kill_reason, kid.bye_reason, run is not None, overrun is not None)
        if not self.stopping:
            self.restarts[reason] += 1  # a replacement is spawned
            metrics.record(lambda m: m.child_restarts.labels(self.name, reason).inc())
        crashed = (kid.kill_reason is None and (kid.bye_reason is None or run is not None) and not clean_exit
                   and overrun is None)
        logger.log(logging.WARNING if crashed else logging.INFO, "%s: child %d (pid %d) %s%s", self.who,
                   kid.slot, kid.pid, how, f" while running {run.id} ({run.name})" if run else "",
                   extra={"child_pid": kid.pid, "run_id": run.id if run else None, "event": "child_exit"})
        if run is None:
            return
        end = ChildEnd(
            run=run, pid=kid.pid, how=how, clean_exit=clean_exit, kill_reason=kid.kill_reason,
            bye_reason=kid.bye_reason, steps=tuple(steps), crashes=self.crashes[run.id],
            max_crashes=self.config.max_crashes, stopping=self.stopping is not None, overrun=overrun,
        )
        self._apply(end, decide(end))

    def _apply(self, end: ChildEnd, decision: Decision) -> None:
        """Carry out what ``fate.decide`` said about a dead child's run."""
        run = end.run
        claim = run.claim_as(self.name)
        if decision.crashed:
            self.crashes[run.id] += 1
        try:
            record = outcomes.fail_cancelled_step if decision.action == Action.CANCELLED else outcomes.fail_step
            for step, error in decision.fail_steps:
                record(self.store, claim, run.name, step.step, step.name, error, step.attempt)
            for step, error in decision.retry_steps:
                assert step.retry_in is not None
                outcomes.retry_step(self.store, claim, run.name, step.step, step.name, step.attempt, error,
                                    step.retry_in)
            if decision.action == Action.CANCELLED:
                self.crashes.pop(run.id, None)
                self.counts[Outcome.CANCELLED] += 1
                logger.info("%s: run %s (%s) cancelled; its child (pid %d) was killed", self.who, run.id,
                            run.name, end.pid, extra={"run_id": run.id, "workflow": run.name, "event": "run_cancelled"})
            elif decision.action == Action.REDISPATCH:
                self._redispatch(run)
            elif decision.action == Action.REQUEUE:
                self.counts[Outcome.REQUEUED] += self.loop.requeue(run)
            elif decision.action == Action.FAIL_RUN:
                self.crashes.pop(run.id, None)
                assert decision.run_error is not None
                if outcomes.fail_run(self.store, claim, run, decision.run_error):
                    self.counts[Outcome.FAILED] += 1
            else:
                logger.info("%s: run %s was taken from the child (pid %d) that executed it; its current "
                            "holder carries on", self.who, run.id, end.pid)
        except StoreUnavailable as exc:
            logger.warning("%s: cannot record what happened to run %s (%s); retrying it", self.who, run.id, exc)
            self._redispatch(run)

    def _redispatch(self, run: Run) -> None:
        if self.stopping:
            self.counts[Outcome.REQUEUED] += self.loop.requeue(run)
        else:
            # It may have recorded steps since it was claimed: the next child
            # must read them rather than trust the claim-time answer.
            self.ready.appendleft(dataclasses.replace(run, has_steps=None))

    # -- deadlines ------------------------------------------------------------------

    def _enforce_deadlines(self, now: float) -> None:
        for kid in list(self.children.values()):
            if kid.state == ChildState.KILLED:
                continue
            overdue = [step for step in kid.timed_steps.values() if step.overdue(now)]
            if overdue:
                kid.overdue_steps = overdue
                logger.warning("%s: step %s of run %s exceeded its timeout; killing child %d (pid %d)",
                               self.who, overdue[0].step, overdue[0].run, kid.slot, kid.pid)
                kid.kill(KillReason.TIMEOUT)
                metrics.record(lambda m: m.step_timeouts.labels(self.name).inc(len(overdue)))
            elif kid.channel.stalled_since is not None and now - kid.channel.stalled_since >= self.config.stall_timeout:
                logger.warning("%s: child %d (pid %d) has not read its channel for %.0fs; killing it",
                               self.who, kid.slot, kid.pid, now - kid.channel.stalled_since)
                kid.kill(KillReason.UNRESPONSIVE)
        if self.drain_deadline is not None and now >= self.drain_deadline:
            self.drain_deadline = None
            left = [kid for kid in self.children.values() if kid.state != ChildState.KILLED]
            if left:
                logger.warning("%s: drain deadline passed; killing %s and requeueing their runs",
                               self.who, reporting.plural(len(left), "child", "children"))
            for kid in left:
                kid.kill(KillReason.DRAIN_DEADLINE)

    def _enforce_budgets(self, now: float) -> None:
        """The backstop: kill a child whose bounded step went over its budget
        without the child stopping it (``budgets.py``)."""
        live = [kid for kid in self.children.values() if kid.state != ChildState.KILLED]
        for kid, overrun in self.budgets.check(live, now):
            kid.overrun = overrun
            logger.warning("%s: a step of run %s went over its %s budget (%s); killing child %d (pid %d)",
                           self.who, kid.run.id if kid.run else "-", overrun.resource,
                           describe(overrun.resource, overrun.peak or 0.0), kid.slot, kid.pid)
            kid.kill(KillReason.RESOURCE)

    # -- claiming and dispatch --------------------------------------------------------

    def _held(self) -> list[str]:
        held = [run.id for run in self.ready]
        for kid in self.children.values():
            held += [run.id for run in (kid.run, kid.finishing_run) if run is not None]
        return held

    def _dispatch(self, now: float) -> None:
        if self.stopping:
            return
        available = self._available()
        while available and self.ready:
            self._give(available.pop(), self.ready.popleft())
        if available:
            for run in self.loop.take(now, len(available), self._held()):
                self._give(available.pop(), run)

    def _give(self, kid: Child, run: Run) -> None:
        self._fence_older_executions(run)
        if kid.state == ChildState.FINISHING:
            kid.finishing_run = kid.run
        with traces.dispatch_span(run):
            message = Dispatch(run=child_process.run_to_message(run), trace=traces.inject())
        kid.state = ChildState.BUSY
        kid.run = run
        kid.run_started = time.monotonic()
        self.budgets.handed_run(kid)
        kid.timed_steps.clear()
        kid.delivered = False
        if self._send(kid, message) and not kid.channel.pending:
            kid.delivered = True

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel == FENCE_CHANNEL:
            if payload.rsplit(" ", 1)[0] == self.name:
                self.fences.wake()
        elif channel == REQUEST_CHANNEL:
            self.remote.wake(payload)
        else:
            self.loop.wake()

    # -- fencing --------------------------------------------------------------------

    def _executing(self, settling: bool = False) -> list[tuple[Child, Run]]:
        """Children and the run each is executing now; unless ``settling``,
        not one whose terminal write is under way."""
        return [(kid, kid.executing) for kid in self.children.values()
                if kid.executing is not None and (settling or kid.state != ChildState.FINISHING)]

    def _fence_older_executions(self, run: Run) -> None:
        for kid, held in older_executions(self._executing(), run):
            self._kill_fenced(kid, held, f"re-claimed at epoch {run.claim_epoch}")

    def _check_fences(self, now: float) -> None:
        # Where no notification can say a run was cancelled, look every poll.
        every = None if self.listener.connected else min(self.loop.lease.beat_every, self.config.poll)
        verdict = self.fences.check(now, self._executing(), list(self.ready), every)
        for kid, run in verdict.cancelled:
            logger.warning("%s: run %s was cancelled; killing child %d (pid %d)", self.who, run.id, kid.slot,
                           kid.pid, extra={"run_id": run.id, "child_pid": kid.pid, "event": "cancel_kill"})
            kid.kill(KillReason.CANCELLED)
        for kid, run in verdict.stale:
            self._kill_fenced(kid, run, "its claim moved on")
        if verdict.dropped:
            self.ready = collections.deque(run for run in self.ready if run not in verdict.dropped)

    def _kill_fenced(self, kid: Child, run: Run, why: str) -> None:
        logger.warning("%s: run %s was taken from this execution (%s); killing child %d (pid %d)",
                       self.who, run.id, why, kid.slot, kid.pid,
                       extra={"run_id": run.id, "child_pid": kid.pid, "event": "fenced"})
        kid.kill(KillReason.FENCED)

    # -- operator actions ---------------------------------------------------------------

    def begin_drain(self) -> None:
        if self.stopping:
            return
        self.stopping = StopMode.DRAIN
        self.drain_deadline = time.monotonic() + self.config.drain if self.config.drain > 0 else None
        titles.master(self.name, "draining")
        self.notifier.stopping()
        self.listener.close()
        while self.ready:
            run = self.ready.popleft()
            self.counts[Outcome.REQUEUED] += self.loop.requeue(run)
        for kid in list(self.children.values()):
            if kid.state in (ChildState.IDLE, ChildState.BOOTING):
                self._ask_exit(kid, ByeReason.DRAIN)
            if kid.state != ChildState.KILLED:
                kid.terminate()

    def fast_stop(self) -> None:
        if self.stopping != StopMode.DRAIN:
            self.begin_drain()
        self.stopping = StopMode.QUIT
        for kid in list(self.children.values()):
            kid.kill(KillReason.QUIT)

    def scale(self, procs: int, who: str) -> int:
        """Set the number of children (0 to ``MAX_PROCS``); returns the previous number."""
        previous, self.procs = self.procs, max(0, min(procs, MAX_PROCS))
        if self.procs != previous:
            logger.info("%s: scaling from %d to %d children (%s)", self.who, previous, self.procs, who)
        metrics.record(lambda m: m.pool_size.labels(self.name).set(self.procs))
        self._retire_extra()
        return previous

    def reload(self, who: str) -> Reply:
        """Re-import the app modules, then replace every child: idle ones at
        once, busy ones at their next step boundary. A module that fails to
        import leaves everything as it was, and says so."""
        if self.stopping:
            return ErrorReply("the supervisor is stopping")
        self.notifier.reloading()
        try:
            modules = reimport(self.config.app)
        except ReloadFailed as exc:
            logger.error("%s: %s; keeping the running code (%s)", self.who, exc, who,
                         exc_info=exc.__cause__ is not None and logger.isEnabledFor(logging.DEBUG))
            self.notifier.ready(reporting.status_line(self))
            return ErrorReply(f"{exc}; keeping the running code")
        self.loop.refresh_names()
        replacing = 0
        for kid in list(self.children.values()):
            if kid.state in (ChildState.IDLE, ChildState.BOOTING):
                self._ask_exit(kid, ByeReason.RELOAD)
            elif kid.state in (ChildState.BUSY, ChildState.FINISHING, ChildState.RETIRING):
                kid.bye_reason = kid.bye_reason or ByeReason.RELOAD
                kid.terminate()
            else:
                continue
            replacing += 1
        self.notifier.ready(reporting.status_line(self))
        logger.info("%s: reloaded %s; replacing %s (%s)", self.who, ", ".join(modules) or "no modules",
                    reporting.plural(replacing, "child", "children"), who)
        return ReloadReply(modules=modules, replacing=replacing)

    def kill_run(self, run_id: str, requeue: bool) -> Child | None:
        executing = [(kid, run) for kid, run in self._executing(settling=True) if run.id == run_id]
        if not executing:
            return None
        kid, _ = max(executing, key=lambda pair: pair[1].claim_epoch)  # the current execution
        kid.kill(KillReason.KILL_REQUEUE if requeue else KillReason.KILL)
        return kid

    def handle_request(self, request: Request, who: str) -> Reply:
        from .commands import handle

        return handle(self, request, who)

    # -- reporting ------------------------------------------------------------------

    def _respond_http(self, path: str) -> tuple[int, str, bytes]:
        self._gauge_children()  # gauges of the process tree are read when scraped
        return exposition.respond(path, self.store)

    def _count_request(self, command: str) -> None:
        label = metrics.control_command_label(command)
        metrics.record(lambda m: m.control_requests.labels(self.name, label).inc())

    def _gauge_children(self) -> None:
        reporting.gauge_children(self)

    def _log_progress(self) -> None:
        line = reporting.progress_line(self, reporting.queued(self))
        if line != self._last_progress_line:
            self._last_progress_line = line
            logger.info("%s: %s", self.who, line)

    def _check_burst(self) -> None:
        """``--burst``: stop once nothing is left to claim and every child is idle."""
        if not self.config.burst or self.stopping or self.ready:
            return
        if self.procs == 0:
            if reporting.queued(self):
                logger.warning("%s: burst mode with --procs 0: runs are scheduled but no child will execute them",
                               self.who)
        else:
            kids = list(self.children.values())
            if not kids or any(kid.state != ChildState.IDLE for kid in kids) or self.loop.due:
                return
        logger.info("%s: burst mode: nothing left to run", self.who)
        self.begin_drain()

def _bye_reason(text: str) -> ByeReason:
    try:
        return ByeReason(text)
    except ValueError:
        return ByeReason.EXIT


__all__ = ["Arbiter", "TERMINAL_STATUSES"]
