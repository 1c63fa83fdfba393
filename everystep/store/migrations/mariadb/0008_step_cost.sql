-- What each step cost (see the PostgreSQL migration): CPU seconds and peak
-- RSS growth in bytes, NULL where nothing measured the step.
ALTER TABLE everystep_step
    ADD COLUMN IF NOT EXISTS cpu_seconds DOUBLE,
    ADD COLUMN IF NOT EXISTS peak_rss_bytes BIGINT;
