-- When a run was first claimed: the start of its execution time, which the
-- console and the API's ``duration`` count from (to the end), so that the
-- time it waited in its queue (a delayed start, a rate limit, a full
-- concurrency) is shown apart instead of counted as work. Set by the claim
-- the first time only (store/functions/postgres/claim.sql); later claims
-- (a resume after a sleep, a requeue) keep it. NULL for runs never claimed,
-- and for runs claimed before this version (their duration is unknown).
-- A column without a default: adding it rewrites nothing.
ALTER TABLE everystep_workflow ADD COLUMN first_claimed_at timestamptz;
