"""The supervisor parent: process management around a single-threaded loop.

The arbiter forks children, hands each a run at a time, and watches, in one
``select``: the signal wake-up pipe, the children's channels (an EOF is a
death), the control socket, the metrics port and, on PostgreSQL, a LISTEN
connection that makes a newly committed run claimable within milliseconds.
It never runs workflow code, and it never waits on one thing: it writes to
children without blocking (a child that stops reading is killed as
unresponsive), and its database connections carry a statement timeout, so
no child's step deadline is ever enforced late because of another.

It keeps the processes and the loop; the rest is owned by small parts it
holds, each given only what it needs: where runs come from (``ClaimLoop``,
shared with the threaded worker); the runs held between children and what
becomes of one whose child died (``Ledger``, applying ``fate.decide``, a
pure function); how children are talked to (``ChildChannels``); the
deadlines it enforces (``Deadlines``) and the fenced children it kills
(``FenceWatch``); what operators may ask (``verbs``, ``reload``); what
it says about itself (``reporting``).

Fork safety: before forking, the parent closes its pooled database
connections and its LISTEN connection (and calls ``Config.before_fork``
hooks), so no child can inherit a live connection and finalize it, which
would terminate the parent's session. They reopen lazily afterwards, and a
claim and a fence check follow at once in case a notification arrived
while LISTEN was closed. Every deadline uses ``time.monotonic()``.

Shared memory: right before forking, the parent freezes the collector's
view of its heap (``heap``: CPython's ``gc.freeze()`` recipe), so a
child's garbage collections never write to the app's objects and the
app's pages stay shared with every child.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import selectors
import signal
import socket
import sys
import time

from everystep import history_bound, metrics, traces, versions
from everystep.cliutil import EXIT_USAGE
from everystep.claimloop import ClaimLoop
from everystep.listener import Listener
from everystep.models import TERMINAL_STATUSES, Outcome, Run
from everystep.store import Store, close_default_stores
from everystep.store.channels import FENCE_CHANNEL, REQUEST_CHANNEL

from . import child as child_process
from . import heap, reporting, titles, verbs
from .budgets import Budgets
from .channels import ChildChannels
from .children import Child, describe_exit
from .claim_ahead import ClaimAhead
from .config import MAX_PROCS, Config
from .control import ControlServer
from .deadlines import Deadlines
from .fate import ChildEnd, decide, restart_reason
from .fencing import FenceWatch
from .http import LoopHTTPServer
from .ledger import Ledger
from .protocol import Channel, Dispatch, Ready
from .reload import reload
from .remote import RemoteControl
from .sdnotify import Notifier
from .signals import SignalQueue
from .states import ByeReason, ChildState, KillReason, StopMode
from .stepboard import StepBoard

logger = logging.getLogger("everystep.supervisor")

MAX_BOOT_FAILURES = 5
SWEEP_EVERY = 1.0


class Arbiter:
    """Forks, watches and replaces the children; one ``select`` loop."""

    def __init__(self, config: Config, store: Store, notifier: Notifier | None = None) -> None:
        self.config = config
        self.store = store
        self.notifier = notifier or Notifier(None)
        self.name = config.name
        self.procs = config.procs
        self.who = f"everystep-supervisor {config.name}"
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, Child] = {}
        self.restarts: collections.Counter[str] = collections.Counter()
        self.stopping: StopMode | None = None
        self.exit_code = 0
        self.started = time.monotonic()
        self.signals = SignalQueue()
        self.loop = ClaimLoop(store, config.name, "supervisor", lease=config.lease, poll=config.poll,
                              takeover=config.takeover, logger=logger, who=self.who, queues=config.queues,
                              versions=versions.served(config.serve_versions))
        self.ledger = Ledger(store, config.name, self.who, self.loop, lambda: bool(self.stopping))
        handle_request = functools.partial(verbs.handle, self)
        self.control = ControlServer(config.socket, handle_request, self.selector, idle_timeout=config.control_timeout,
                                     on_request=functools.partial(verbs.count, config.name))
        self.listener = Listener(store, self.selector, self._on_notify, self.who, outage=self.loop.outage,
                                 poll=config.poll, log=logger)
        self.fences = FenceWatch(store, config.name, self.loop.lease.beat_every)
        self.remote = RemoteControl(store, config.name, self.loop.lease.instance, handle_request,
                                    outage=self.loop.outage, queues=config.queues)
        self.budgets = Budgets(self.who, config.cgroups, config.step_memory_limit, config.step_cpu_limit)
        self.history_warning = history_bound.threshold(config.history_warning)
        self.deadlines = Deadlines(self.who, config.name, config.stall_timeout, self.budgets)
        self.ahead = ClaimAhead(config.claim_ahead)
        self.channels = ChildChannels(self.selector, self._on_ready, self._on_done)
        self.http: LoopHTTPServer | None = None
        self._boot_failures = 0
        self._baseline_checked = False
        self._reload_requested = False
        self.progress = reporting.Progress(self.notifier, config.show_progress)
        self._last_sweep = 0.0

    # -- running -------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until stopped; returns the process exit code."""
        titles.master(self.name)
        # First: from here a stop signal is queued for the loop, which drains.
        self.signals.install(self.selector)
        try:
            self.loop.start(self.procs)  # NameInUse: never under a live runner's name
            try:
                self.control.open()
            except BaseException:
                self.loop.stop()
                raise
        except BaseException:
            self.signals.uninstall(self.selector)
            raise
        try:
            self.http = reporting.metrics_server(self, self.selector)
            self.listener.open()
            self.budgets.open()
            self._spawn_missing()
            heap.after_fork()  # forked or not (--procs 0), the parent collects its own garbage from here
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

    def _teardown(self) -> None:
        for kid in list(self.children.values()):
            kid.kill(KillReason.SHUTDOWN)
        self._reap(block=True)
        self.budgets.close()
        if self.stopping:
            self.ledger.requeue_leftovers()
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
        self.deadlines.enforce(self.children.values(), now)
        if self._reload_requested:
            self._reload_requested = False
            reload(self, "SIGHUP")
        self._keep_lease(now)
        self.remote.tick(now)
        if now >= self.fences.next_at:
            # Where no notification can say a run was cancelled, look every poll.
            every = (None if self.listener.connected and self.store.notifies
                     else min(self.loop.lease.beat_every, self.config.poll))
            self.ledger.drop(self.fences.enforce(now, self.children.values(), list(self.ledger.ready), every))
        self._spawn_missing()
        if not self.stopping and self.listener.maintain(now):
            self._listening_again()
        self._dispatch(now)
        self._periodic(now)

    def _timeout(self, now: float) -> float:
        candidates = [1.0, max(self.fences.next_at - now, 0.0)]
        if not self.stopping:
            claiming = self._available() or self.ahead.wanted(len(self.ledger.ready), self.procs)
            due = self.loop.next_due(now) if claiming else self.loop.housekeeping_due(now)
            candidates.append(max(due - now, 0.0))
            if self.ledger.ready and self._available():
                candidates.append(0.0)
        deadline = self.deadlines.next_at(self.children.values(), now)
        if deadline is not None:
            candidates.append(max(deadline - now, 0.0))
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
            reporting.gauge_children(self)
            self.budgets.sweep()
        self.progress.tick(self, now)
        if reporting.burst_over(self):
            self.begin_drain()

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
        took = heap.before_fork()  # last: what the hooks dropped is not frozen
        logger.debug("%s: froze %d objects before forking in %.1f ms", self.who, heap.frozen(), took * 1000)

    def _after_fork(self) -> None:
        heap.after_fork()
        if not self.stopping:
            self.listener.open()
        self._listening_again()

    def _listening_again(self) -> None:
        """LISTEN was closed (around a fork, or lost): whatever was notified
        meanwhile was missed, a newly scheduled run or a held run cancelled
        or taken (a cancelled parent's children, whose first kill forked a
        replacement), so claim and check the held runs at once."""
        self.loop.wake()
        self.fences.wake()

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
            cgroup=group, history_warning=self.history_warning,
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
                    board=board, group=group)
        self.children[pid] = kid
        self.channels.watch(kid)
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
                kid.retire()
            else:
                self.channels.ask_exit(kid, ByeReason.SCALE)

    def _on_ready(self, kid: Child, ready: Ready) -> None:
        self._boot_failures = 0
        kid.owned = ready.owned
        self.budgets.joined(kid, ready.cgroup)
        if not self._baseline_checked:
            self._baseline_checked = True
            self._check_baseline(kid, ready.owned)

    def _check_baseline(self, kid: Child, owned: int) -> None:
        """A ``--max-memory-per-child`` below what a child owns as it starts
        would replace every child after every run: refused at start."""
        limit = self.config.max_memory_per_child
        if not limit or owned <= limit * 1024 * 1024:
            return
        logger.error("%s: --max-memory-per-child %d MB is below what a new child owns (%.0f MB USS, child %d "
                     "right after it started): every child would be replaced after every run; set it above %d "
                     "or to 0", self.who, limit, owned / 1048576, kid.slot, -(-owned // 1048576),
                     extra={"event": "max_memory_below_baseline"})
        self.exit_code = EXIT_USAGE
        self.begin_drain()

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
                reporting.gauge_children(self)

    def _on_exit(self, kid: Child, status: int) -> None:
        self.channels.last_words(kid)
        how, _ = describe_exit(status, kid.kill_reason)
        unstarted = kid.reaped()
        if unstarted is not None:
            # It never started there: another child takes it; the run it was
            # settling, if any, is the one its death is about.
            self.ledger.redispatch(unstarted)
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
        if kid.bye_reason == ByeReason.MAX_MEMORY:
            how += (f" (replaced: it owned {kid.owned / 1048576:.0f} MB, USS, over --max-memory-per-child "
                    f"{self.config.max_memory_per_child})")
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
            bye_reason=kid.bye_reason, steps=tuple(steps), crashes=self.ledger.crashes[run.id],
            max_crashes=self.config.max_crashes, stopping=self.stopping is not None, overrun=overrun,
        )
        self.ledger.apply(end, decide(end))

    # -- claiming and dispatch --------------------------------------------------------

    def _dispatch(self, now: float) -> None:
        if self.stopping:
            return
        available = self._available()
        while available and self.ledger.ready:
            self._give(available.pop(), self.ledger.ready.popleft())
        if available:
            for run in self.loop.take(now, len(available), self.ledger.held(self.children.values())):
                self._give(available.pop(), run)
        if self.procs == 0 and self.ledger.ready:
            self.ledger.requeue_ready()  # scaled to none: nobody here will start them
        elif not available and (ahead := self.ahead.wanted(len(self.ledger.ready), self.procs)):
            # Every child busy with short runs: a batch ready for the next to free.
            self.ledger.ready.extend(self.loop.take(now, ahead, self.ledger.held(self.children.values())))

    def _on_done(self, kid: Child, run: Run, outcome: Outcome) -> None:
        self.ahead.ended(kid.last_run_seconds)
        self.ledger.ended(kid, run, outcome)

    def _give(self, kid: Child, run: Run) -> None:
        self.fences.fence_older(self.children.values(), run)
        with traces.dispatch_span(run):
            message = Dispatch(run=child_process.run_to_message(run), trace=traces.inject())
        kid.hand(run, time.monotonic())
        self.budgets.handed_run(kid)
        self.channels.send(kid, message)

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel == FENCE_CHANNEL:
            if payload.rsplit(" ", 1)[0] == self.name:
                self.fences.wake()
        elif channel == REQUEST_CHANNEL:
            self.remote.wake(payload)
        else:
            self.loop.wake()

    # -- operator actions ---------------------------------------------------------------

    def begin_drain(self) -> None:
        if self.stopping:
            return
        self.stopping = StopMode.DRAIN
        self.deadlines.drain_by = time.monotonic() + self.config.drain if self.config.drain > 0 else None
        titles.master(self.name, "draining")
        self.notifier.stopping()
        self.listener.close()
        self.ledger.requeue_ready()
        for kid in list(self.children.values()):
            if kid.state in (ChildState.IDLE, ChildState.BOOTING):
                self.channels.ask_exit(kid, ByeReason.DRAIN)
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

    def replace_children(self, reason: ByeReason) -> int:
        """Replace every child: idle ones leave now, busy ones are asked to
        stop at their next step boundary; returns how many."""
        replacing = 0
        for kid in list(self.children.values()):
            if kid.state in (ChildState.IDLE, ChildState.BOOTING):
                self.channels.ask_exit(kid, reason)
            elif kid.state in (ChildState.BUSY, ChildState.FINISHING, ChildState.RETIRING):
                kid.leaving(reason)
                kid.terminate()
            else:
                continue
            replacing += 1
        return replacing


__all__ = ["Arbiter", "TERMINAL_STATUSES"]
