"""The threaded Worker: claim runs and execute them on a thread pool.

This is the embedded mode (``everystep worker``, or ``Worker(...).run()``
inside a host process); the prefork ``everystep-supervisor`` is the
production runner for CPU-bound work.

Name contract: every run this worker claims is ``running`` under its
``name``. At startup it takes the name (refused with ``NameInUse`` while a
live runner holds it; ``takeover=True`` is the operator's override) and
re-claims the runs a crashed process with the same name left behind
(catchup), so give each worker a stable, unique name.

Pickup: on PostgreSQL (and MariaDB) a LISTEN connection (``listener``)
wakes the claim loop as soon as a run is scheduled; ``poll`` is the
fallback, and the only way behind a transaction pooler without a
``--listen-database`` URL (said once at start).

Stopping (SIGTERM/SIGINT when standalone, or ``stop()``): no new claims;
every run in flight stops at its next step boundary and is requeued with its
finished steps recorded. Runs still executing a step when the ``drain``
deadline passes are requeued anyway (their late writes are refused, since
the claim is gone); ``run()`` returns their ids so a standalone process can
exit without joining the stuck threads, while an embedding host just
carries on. A repeated signal during the drain changes nothing: the
deadline still decides.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

from . import aio, exposition, history_bound, metrics, outcomes, registry, runner
from .claimloop import ClaimLoop
from .context import SignalFlag
from .errors import EverystepError
from .exposition import ThreadedMetricsServer
from .lease import DEFAULT_LEASE, Lease
from .history_bound import HistoryBound
from .listener import Listener
from .context import Observer
from .models import Outcome, Run
from .observer import Observers
from .store import Store, default_store
from .store.channels import FENCE_CHANNEL, REQUEST_CHANNEL

logger = logging.getLogger("everystep")


def refuse_step_limits() -> None:
    """Refuse to start while an imported step declares a memory or CPU
    limit: threads share one process, so nothing here could bound one step
    (``EverystepError``, one line naming the steps)."""
    limited = registry.limited_steps()
    if limited:
        named = "; ".join(f"{name} ({limits})" for name, limits in sorted(limited.items())[:3])
        more = f" and {len(limited) - 3} more" if len(limited) > 3 else ""
        raise EverystepError(
            f"the threaded worker cannot enforce step resource limits (its runs share one process): {named}{more}; "
            "run these workflows with everystep-supervisor"
        )


class Worker:
    """Claim scheduled runs and execute them on ``pool_size`` threads
    (from ``queues`` only, when given; see ``everystep.queues``)."""

    def __init__(
        self,
        pool_size: int = 4,
        poll: float = 0.2,
        name: str | None = None,
        drain: float = 30.0,
        database: str | Store | None = None,
        observer: Observer | None = None,
        metrics_port: int = 0,
        metrics_bind: str = "0.0.0.0",
        lease: float = DEFAULT_LEASE,
        takeover: bool = False,
        queues: Sequence[str] | None = None,
        async_runs: int = 100,
        history_warning: int | None = None,
    ) -> None:
        if pool_size < 1:
            raise EverystepError("pool_size must be at least 1")
        if async_runs < 1:
            raise EverystepError("async_runs must be at least 1")
        if poll <= 0:
            raise EverystepError("poll must be a positive number of seconds")
        self.pool_size = pool_size
        self.poll = poll
        self.name = name or socket.gethostname()
        self.drain = drain
        self.store = database if isinstance(database, Store) else default_store(database)
        #: The history bound (``everystep.history_bound``): a run whose history passes
        #: ``history_warning`` records (else ``$EVERYSTEP_HISTORY_WARNING``, else 10,000) is said once.
        self.observer = Observers([HistoryBound(history_bound.threshold(history_warning)), observer])
        self.metrics_port = metrics_port
        self.metrics_bind = metrics_bind
        self.loop = ClaimLoop(self.store, self.name, "worker", lease=lease, poll=poll, takeover=takeover,
                              logger=logger, queues=queues)
        self.metrics_server: ThreadedMetricsServer | None = None
        self._stopping = SignalFlag()
        self._draining = SignalFlag()
        self._active: dict[Future[None], Run] = {}
        #: Async runs are tasks on one loop (``aio.SharedLoop``, started at
        #: the first): they hold no pool thread, up to ``async_runs`` at once.
        self.async_runs = async_runs
        self._async: set[Future[None]] = set()
        self._shared: aio.SharedLoop | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Guards the pipe's closing: after run() returns, stop() calls and the
        # done-callbacks of runs stuck past the drain deadline must not write
        # to a descriptor number the host may have reused for its own file.
        self._wake_lock = threading.Lock()
        self._wake_closed = False
        self.requeued = 0

    @property
    def lease(self) -> Lease:
        return self.loop.lease

    @property
    def claimed(self) -> int:
        return self.loop.claimed

    # -- control ---------------------------------------------------------------

    def stop(self) -> None:
        """Begin a drain (thread-safe, signal-safe)."""
        self._stopping.set()
        self._draining.set()
        self._wake()

    def _wake(self) -> None:
        # Never block: this runs in signal handlers, which may interrupt the
        # very thread holding the lock. Whoever holds it is either writing a
        # wake-up byte already or closing the pipe after the loop ended.
        if not self._wake_lock.acquire(blocking=False):
            return
        try:
            if not self._wake_closed:
                os.write(self._wake_w, b"\0")
        except OSError:
            pass  # the pipe is full: the loop is awake anyway
        finally:
            self._wake_lock.release()

    def _close_wake_pipe(self) -> None:
        with self._wake_lock:
            self._wake_closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(signum: int, frame: object) -> None:
            self.stop()

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # -- main loop -------------------------------------------------------------

    def run(self) -> list[str]:
        """Work until stopped; returns the ids of runs whose threads were
        still busy at the drain deadline (empty after a clean drain). Each
        was requeued unless another runner had taken it meanwhile; either
        way its thread is stuck, so a standalone process must not join it."""
        try:
            refuse_step_limits()
        except EverystepError:
            self._close_wake_pipe()
            raise
        self.loop.start(self.pool_size)  # raises NameInUse before anything is claimed
        if self.metrics_port:
            try:
                self.metrics_server = ThreadedMetricsServer(self.metrics_port, self.metrics_bind, self.store,
                                                            self.loop.engine).start()
            except OSError as exc:
                raise EverystepError(exposition.bind_error(self.metrics_bind, self.metrics_port, exc)) from None
            logger.info("everystep worker %s: metrics on http://%s:%d/metrics", self.name, self.metrics_bind,
                        self.metrics_server.port)
        executor = ThreadPoolExecutor(max_workers=self.pool_size, thread_name_prefix="everystep-worker")
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        logger.info("everystep worker %s: started, pool %d, %s", self.name, self.pool_size, self.store.describe())
        listener = Listener(self.store, selector, self._on_notify, self.loop.who, outage=self.loop.outage,
                            poll=self.poll, log=logger)
        listener.open()
        leftovers: list[str] = []
        # The handlers stay in place through the drain: a repeated TERM (a
        # process manager) or a second Ctrl-C would otherwise kill the
        # process with its runs claimed, or raise KeyboardInterrupt and hang
        # at exit joining a stuck thread, instead of honouring the deadline.
        with self._signals():
            try:
                while not self._stopping.is_set():
                    self._reap()
                    now = time.monotonic()
                    if not self.loop.keep_lease(now):
                        self.stop()  # another instance holds our name now
                        break
                    executing = [run.id for run in self._active.values()]
                    taken = self.loop.take(now, self._capacity(), executing)
                    if self._stopping.is_set():
                        # stop() came during the claim: a run that its drain
                        # just requeued at a step boundary may be among these.
                        # Hand them back unrun; stop() sets the flag before any
                        # run drains, so a claim that finished before this
                        # check never took a drained run.
                        for run in taken:
                            self.loop.requeue(run)
                        break
                    self._submit(executor, taken)
                    for key, mask in selector.select(self._wait_time(time.monotonic())):
                        if key.data is None:
                            self._drain_wake_pipe()
                        else:
                            key.data(mask)
                    if listener.maintain(time.monotonic()):
                        self.loop.wake()  # what was notified meanwhile was missed
            finally:
                listener.close()
                leftovers = self._shutdown(executor)
                self.loop.stop()
                self._count_inflight()
                if self.metrics_server is not None:
                    self.metrics_server.close()
                selector.close()
                self._close_wake_pipe()
        logger.info("everystep worker %s: stopped", self.name)
        return leftovers

    def _on_notify(self, channel: str, payload: str) -> None:
        """A run was scheduled (or the LISTEN connection was lost): claim.
        Fences and operator requests are the supervisor's business."""
        if channel not in (FENCE_CHANNEL, REQUEST_CHANNEL):
            self.loop.wake()

    def _capacity(self) -> int:
        """Runs to claim now: a free pool thread for each (a sync run needs
        one), and as many free places on the shared loop (an async run may
        be among them; at ``async_runs`` nothing more is claimed)."""
        threads = self.pool_size - (len(self._active) - len(self._async))
        return max(0, min(threads, self.async_runs - len(self._async)))

    def _wait_time(self, now: float) -> float:
        """Until the claim loop has something to do; with no free thread, a
        finishing run wakes us (its done-callback writes to the pipe)."""
        due = self.loop.next_due(now) if self._capacity() > 0 else self.loop.housekeeping_due(now)
        return max(0.0, min(self.poll, due - now))

    def _submit(self, executor: ThreadPoolExecutor, runs: list[Run]) -> None:
        for run in runs:
            workflow = registry.get_workflow(run.name)
            future: Future[None]
            if workflow is not None and workflow.is_async:
                if self._shared is None:
                    self._shared = aio.SharedLoop()
                future = self._shared.submit(self._execute_async(run))
                self._async.add(future)
            else:
                future = executor.submit(self._execute, run)
            self._active[future] = run
            future.add_done_callback(self._run_ended)
        self._count_inflight()

    def _run_ended(self, future: Future[None]) -> None:
        self.loop.wake()  # a thread is free: claim at once
        self._wake()

    def _reap(self) -> None:
        for future in [future for future in self._active if future.done()]:
            del self._active[future]
            self._async.discard(future)
        self._count_inflight()

    def _count_inflight(self) -> None:
        inflight = sum(1 for future in self._active if not future.done())
        metrics.record(lambda m: m.inflight.labels(self.name).set(inflight))

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    # -- executing one run -------------------------------------------------------

    def _execute(self, run: Run) -> None:
        outcome = runner.execute_guarded(
            self.store, run, claimer=self.name, draining=self._draining, observer=self.observer
        )
        self._ended(run, outcome)

    async def _execute_async(self, run: Run) -> None:
        """An async run, as a task on the shared loop: ``_execute``'s twin."""
        outcome = await aio.execute_guarded(self.store, run, claimer=self.name, draining=self._draining,
                                            observer=self.observer)
        self._ended(run, outcome)

    def _ended(self, run: Run, outcome: Outcome) -> None:
        if outcome == Outcome.REQUEUED:
            self.requeued += 1
        elif outcome == Outcome.DEFERRED:
            self.loop.engine.failed(f"run {run.id} ({run.name}) given back")
        outcomes.log_outcome(logger, f"everystep worker {self.name}", run, outcome)

    def _requeue(self, run: Run) -> bool:
        """Give a run back to the queue at shutdown (if the database is away,
        the run stays ours: a restart or another runner's lease sweep takes it)."""
        requeued = self.loop.requeue(run)
        self.requeued += requeued
        return requeued

    # -- shutdown ----------------------------------------------------------------

    def _shutdown(self, executor: ThreadPoolExecutor) -> list[str]:
        self._draining.set()
        executor.shutdown(wait=False, cancel_futures=True)
        self._reap()
        pending = list(self._active)
        if pending:
            logger.info("everystep worker %s: draining %d run(s)", self.name, len(pending))
            timeout = self.drain if self.drain and self.drain > 0 else None
            _, not_done = wait_futures(pending, timeout=timeout)
        else:
            not_done = set()
        for future in [future for future in self._active if future.cancelled()]:
            self._requeue(self._active[future])  # claimed but never started
        leftovers = []
        requeued = 0
        for future in not_done:
            run = self._active[future]
            requeued += self._requeue(run)
            leftovers.append(run.id)
        if self._shared is not None:
            self._shared.stop()  # the tasks of runs given back are cancelled at their awaits
        if not_done:
            logger.warning(
                "everystep worker %s: drain deadline of %ss passed with %d run(s) mid-step; requeued %d",
                self.name, self.drain, len(not_done), requeued,
            )
        else:
            executor.shutdown(wait=True)
        return leftovers
