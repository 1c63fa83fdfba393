-- How many step records a run held when its last execution ended, noted
-- (by the runner, after that execution's own writes) only once a history
-- is long: the metrics' largest history among running and waiting runs
-- reads it from the run rows, never by counting steps. NULL: never noted
-- (a short history). Nullable with no default: no table rewrite.
ALTER TABLE everystep_workflow ADD COLUMN history integer;
