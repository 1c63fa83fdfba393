-- What each step cost (see the PostgreSQL migration): CPU seconds and peak
-- RSS growth in bytes, NULL where nothing measured the step.
ALTER TABLE everystep_step ADD COLUMN cpu_seconds REAL;
ALTER TABLE everystep_step ADD COLUMN peak_rss_bytes INTEGER;
