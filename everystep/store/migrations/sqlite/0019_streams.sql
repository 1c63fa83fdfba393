-- Streams: values out of a running run, as they happen (see the PostgreSQL
-- migration).
CREATE TABLE everystep_stream (
    workflow_id TEXT NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    value       TEXT,
    step_id     TEXT NOT NULL,
    attempt     INTEGER,
    closed      INTEGER NOT NULL DEFAULT 0,
    withdrawn   INTEGER NOT NULL DEFAULT 0,
    written_at  TEXT NOT NULL,
    PRIMARY KEY (workflow_id, key, seq)
);

CREATE INDEX everystep_stream_step ON everystep_stream (workflow_id, step_id) WHERE attempt IS NOT NULL;
