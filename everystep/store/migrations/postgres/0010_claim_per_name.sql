-- The claim looks for each served workflow's runs by name.
--
-- Version 9's claim walked a queue's scheduled runs of one priority in due
-- order and tested each one's name against the served names. Runs of a
-- workflow the supervisor does not serve (another application's, or one
-- whose code was removed) that were due earlier were read and discarded by
-- every claim: 100,000 of them made a claim 38 ms of server time and cut a
-- supervisor's rate by 91 % (benchmark case 7).
--
-- The claimable index now holds the name after the priority, so one
-- queue's scheduled runs of one priority and one name are a single range
-- in due order, which the claim (store/functions/postgres/claim.sql) reads
-- name by name: runs nobody serves are never read.

DROP INDEX everystep_workflow_claimable;

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (queue, priority DESC, name, (coalesce(not_before, created_at)))
    WHERE status = 'scheduled';
