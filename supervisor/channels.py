"""The parent's end of every child's channel: sending, reading, and what a
message says about its child.

Apart from the arbiter because it is how things are said, not what is
decided: the arbiter chooses which child gets which run and when it must
go; this module carries that out without ever blocking (a child that stops
reading leaves its channel ``stalled_since``, and ``deadlines`` kills it),
and tells the child's record what its messages say (booted, a timed step
started or ended, the terminal write under way, leaving), through the
transitions ``Child`` owns. A closed channel is never an error here: the child's exit, seen by the
reaper, says what happened. Two events need the arbiter and go to it: a
child that booted (``on_ready``) and a run that ended (``on_done``).
"""

from __future__ import annotations

import selectors
from collections.abc import Callable

from everystep.models import Outcome, Run

from .children import Child
from .protocol import Bye, ChannelClosed, Done, Exit, Finishing, Message, Ready, StepEnded, StepStarted
from .states import ByeReason, ChildState, KillReason


class ChildChannels:
    def __init__(self, selector: selectors.BaseSelector, on_ready: Callable[[Child, Ready], None],
                 on_done: Callable[[Child, Run, Outcome], None]) -> None:
        self.selector = selector
        self.on_ready = on_ready
        self.on_done = on_done

    def watch(self, kid: Child) -> None:
        """Start reading a new child's channel in the loop's ``select``."""
        self.selector.register(kid.channel.sock, selectors.EVENT_READ, lambda mask, k=kid: self._on_event(k, mask))

    def send(self, kid: Child, message: Message) -> bool:
        """Queue ``message`` for ``kid`` without blocking; False (and the
        child killed) if its channel is gone."""
        try:
            kid.channel.send(message)
        except ChannelClosed:
            kid.kill(KillReason.UNRESPONSIVE)
            return False
        if not kid.channel.pending:
            kid.flushed()
        self._interest(kid)
        return True

    def ask_exit(self, kid: Child, reason: ByeReason) -> None:
        kid.retire()
        self.send(kid, Exit(reason))

    def last_words(self, kid: Child) -> None:
        """A child exited: read what it sent just before, then close."""
        if kid.channel_open:
            self._on_event(kid, selectors.EVENT_READ)
            self.close(kid)

    def close(self, kid: Child) -> None:
        if kid.channel_open:
            kid.channel_open = False
            try:
                self.selector.unregister(kid.channel.sock)
            except (KeyError, ValueError):
                pass
            kid.channel.close()

    def _interest(self, kid: Child) -> None:
        if not kid.channel_open:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if kid.channel.pending else 0)
        self.selector.modify(kid.channel.sock, events, lambda mask, k=kid: self._on_event(k, mask))

    def _on_event(self, kid: Child, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            try:
                kid.channel.flush()
            except ChannelClosed:
                pass  # the EOF on the read side says it
            if not kid.channel.pending:
                kid.flushed()
                self._interest(kid)
        if mask & selectors.EVENT_READ:
            messages, closed = kid.channel.read_available()
            for message in messages:
                self._on_message(kid, message)
            if closed:
                self.close(kid)

    def _on_message(self, kid: Child, message: Message) -> None:
        if isinstance(message, Ready):
            self.on_ready(kid, message)
            kid.ready()
        elif isinstance(message, StepStarted):
            kid.step_timed(message.step)
        elif isinstance(message, StepEnded):
            kid.step_ended(message.step)
        elif isinstance(message, Finishing):
            kid.finishing(message.run)
        elif isinstance(message, Done):
            self._run_done(kid, message)
        elif isinstance(message, Bye):
            kid.said_bye(ByeReason.parse(message.reason))

    def _run_done(self, kid: Child, done: Done) -> None:
        run = kid.done(done.run, done.owned)
        if run is None:
            return
        self.on_done(kid, run, Outcome(done.outcome))
        if kid.run is None and kid.state == ChildState.RETIRING and kid.bye_reason is None:
            # Retired while busy (scale down), and nothing else waits for it.
            self.ask_exit(kid, ByeReason.SCALE)
