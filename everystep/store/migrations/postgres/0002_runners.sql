-- Live runners and their heartbeats: a runner silent for longer than its
-- lease is presumed dead, and any live runner requeues its runs.
CREATE TABLE everystep_runner (
    name          text PRIMARY KEY,
    instance      text NOT NULL,
    kind          text NOT NULL,
    host          text NOT NULL,
    pid           integer NOT NULL,
    lease_seconds double precision NOT NULL CHECK (lease_seconds > 0),
    started_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
