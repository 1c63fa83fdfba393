"""The PostgreSQL NOTIFY channels, named once.

The statements of ``queries/postgres.sql`` name a channel by placeholder
(``{scheduled_channel}``) and ``queries.load`` renders it from here; the
listeners (the claim loop's, the console's, the supervisor's) compare what
they hear with the same constants. MariaDB has no NOTIFY: its wake-up
(``mariadb_wake``) reports a woken sleep as a notification on
``SCHEDULED_CHANNEL``, so a runner reads both backends alike.
"""

from __future__ import annotations

#: A run became claimable (scheduled, released from a wait, requeued);
#: payload: its workflow's name.
SCHEDULED_CHANNEL = "everystep_scheduled"
#: A run a runner holds was taken from it (``requeue --force``); payload:
#: ``"RUNNER RUN_ID"``.
FENCE_CHANNEL = "everystep_fenced"
#: An operator request for a runner (``everystep.relay``); payload: the
#: runner's name.
REQUEST_CHANNEL = "everystep_request"
#: A value was written to a run's stream (``everystep.write_stream``);
#: payload: the run's id. Only stream readers listen to it.
STREAM_CHANNEL = "everystep_stream"

#: Placeholder of ``queries/*.sql`` → the channel it stands for.
PLACEHOLDERS: dict[str, str] = {
    "scheduled_channel": SCHEDULED_CHANNEL,
    "fence_channel": FENCE_CHANNEL,
    "request_channel": REQUEST_CHANNEL,
    "stream_channel": STREAM_CHANNEL,
}

__all__ = ["FENCE_CHANNEL", "PLACEHOLDERS", "REQUEST_CHANNEL", "SCHEDULED_CHANNEL", "STREAM_CHANNEL"]
