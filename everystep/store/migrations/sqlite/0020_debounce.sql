-- Debounced scheduling (see the PostgreSQL migration).
ALTER TABLE everystep_workflow ADD COLUMN debounce_calls INTEGER;

CREATE TABLE everystep_debounce (
    name         TEXT NOT NULL,
    debounce_key TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    first_at     TEXT NOT NULL,
    calls        INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (name, debounce_key)
);
