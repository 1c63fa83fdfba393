"""The supervisor's words the library needs too, said once.

The library never imports the supervisor, yet it speaks of it: the relay
(``everystep remote``, the console) submits the supervisor's commands, and
the metrics name the commands it counts and the reasons it replaces a
child. Those vocabularies live here, and the supervisor imports them: a new
restart reason is one line in this file, and a new ``ctl`` verb one line
here besides its declaration in the supervisor (``supervisor.verbs``, its
request and reply in ``supervisor.protocol``). Every list of them follows:
the relay's accepted commands and ``everystep remote``'s choices and help,
the metric labels made known at start.
"""

from __future__ import annotations

from enum import StrEnum


class Command(StrEnum):
    """What an operator may ask a supervisor (``ctl``, ``everystep remote``,
    the console): the ``cmd`` of a control request."""

    STATUS = "status"
    KILL = "kill"
    SCALE = "scale"
    RELOAD = "reload"
    DRAIN = "drain"


#: The label a control request gets when it names no known command: hostile
#: clients choose the string, so the metric's labels stay bounded.
INVALID_COMMAND = "invalid"


class RestartReason(StrEnum):
    """Why a supervisor replaced a child: the label of
    ``everystep_supervisor_child_restarts_total``."""

    EXIT = "exit"
    CRASH = "crash"
    RECYCLE = "recycle"
    TIMEOUT = "timeout"
    KILL = "kill"
    FENCED = "fenced"
    CANCELLED = "cancelled"
    RESOURCE = "resource"  # a step went over its budget, or the kernel ran out of memory for it


__all__ = ["Command", "INVALID_COMMAND", "RestartReason"]
