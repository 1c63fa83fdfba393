-- What each step cost, as the process that ran it measured it (the
-- supervisor's children measure every step): CPU seconds, user + system, of
-- the process and of the subprocesses it waited for, and how far the step
-- raised its process's peak resident memory above what it held when the
-- step started, in bytes. NULL where nothing measured the step (the
-- threaded worker, steps failed from outside their process, older rows).
-- Columns without a default: adding them rewrites nothing.
ALTER TABLE everystep_step ADD COLUMN cpu_seconds double precision;
ALTER TABLE everystep_step ADD COLUMN peak_rss_bytes bigint;
