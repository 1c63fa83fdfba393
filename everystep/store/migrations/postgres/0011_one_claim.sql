-- Stored functions move to their own files (store/functions/postgres/),
-- one per function, which the migrator re-applies when their text changes:
-- a change to the claim is now a diff of claim.sql, not a migration that
-- restates the whole body. This table records, per file, the SHA-256 of
-- the text last applied. An existing database has it empty, so its
-- functions are re-applied once, from the files, after this version.
CREATE TABLE everystep_function (
    name       text PRIMARY KEY,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL
);
