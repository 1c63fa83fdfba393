-- Debounced scheduling (schedule(..., debounce=Debounce(key, period, max_wait))).
--
-- A debounced run is an ordinary scheduled run whose not-before time is the
-- end of its key's quiet window, with wait_key 'debounce:<key>' (the wait
-- kind of wait_kinds.py) and debounce_calls, the schedules folded into it.
-- everystep_debounce holds, per workflow and key, the run of the window
-- last opened, when that window began and the calls ever made on the key
-- (what the upsert writes on every call). A schedule takes this row's lock
-- first (the upsert), then folds into that run while it is still scheduled
-- and never claimed, or points the row at a new run. The row is the point where concurrent
-- schedulers of one key meet; the claim never reads it.
ALTER TABLE everystep_workflow ADD COLUMN debounce_calls integer;

CREATE TABLE everystep_debounce (
    name         text NOT NULL,
    debounce_key text NOT NULL,
    run_id       uuid NOT NULL,
    first_at     timestamptz NOT NULL,
    calls        bigint NOT NULL DEFAULT 1,
    PRIMARY KEY (name, debounce_key)
);
