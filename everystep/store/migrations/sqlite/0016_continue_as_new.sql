-- Runs that continue as new (see the PostgreSQL migration).
ALTER TABLE everystep_workflow ADD COLUMN continued_from TEXT;

ALTER TABLE everystep_workflow ADD COLUMN continued_as TEXT;
