-- Streams: values out of a running run, as they happen (everystep.streams).
--
-- One row per value, ordered per run and key by `seq` (1, 2, 3 …, never
-- reused: a reader resumes after the last seq it saw). `step_id` is the
-- step that wrote it: a body's write is a recorded step of its own
-- (`attempt` NULL); a write from inside a step's code carries the id of
-- the execution whose attempt of the step wrote it (`attempt`: when that
-- execution began, in nanoseconds since the epoch). When a later
-- execution of that step writes, the earlier executions' rows of it are
-- withdrawn (`withdrawn`, their value dropped) in the transaction of that
-- first write, so a reader that comes later never sees a killed attempt's
-- values beside its retry's. The last row of a closed stream is its
-- `closed` marker (no value). Rows go with their run (ON DELETE CASCADE:
-- `everystep prune`).
CREATE TABLE everystep_stream (
    workflow_id uuid NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    key         text NOT NULL,
    seq         bigint NOT NULL,
    value       json,
    step_id     text NOT NULL,
    attempt     bigint,
    closed      boolean NOT NULL DEFAULT false,
    withdrawn   boolean NOT NULL DEFAULT false,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (workflow_id, key, seq)
);

-- The withdrawal of an earlier execution's values of one step.
CREATE INDEX everystep_stream_step ON everystep_stream (workflow_id, step_id) WHERE attempt IS NOT NULL;
