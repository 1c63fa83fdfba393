-- Runs that continue as new (see the PostgreSQL migration).
ALTER TABLE everystep_workflow
    ADD COLUMN IF NOT EXISTS continued_from CHAR(36) CHARACTER SET ascii COLLATE ascii_bin,
    ADD COLUMN IF NOT EXISTS continued_as CHAR(36) CHARACTER SET ascii COLLATE ascii_bin;
