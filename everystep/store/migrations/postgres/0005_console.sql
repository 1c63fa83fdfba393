-- Operator requests relayed to a runner through the database, and what a
-- supervisor publishes about its children.
--
-- The console (or the CLI) on any host inserts a request addressed to a
-- runner by name and NOTIFYs `everystep_request` with that name; the
-- supervisor holding the name takes it (pending -> taken), runs it through
-- the same handler as its control socket and writes the reply (answered).
-- A request nobody took in time is expired by its requester, so a
-- supervisor that comes back later never acts on a stale order.
CREATE TABLE everystep_request (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    runner       text NOT NULL,
    command      text NOT NULL,
    args         json NOT NULL,
    status       text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'taken', 'answered', 'expired')),
    reply        json,
    requested_by text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    taken_at     timestamptz,
    answered_at  timestamptz
);

-- A supervisor polls only its own pending requests: a tiny partial index.
CREATE INDEX everystep_request_pending ON everystep_request (runner, id) WHERE status = 'pending';

-- Old requests are pruned by age.
CREATE INDEX everystep_request_created ON everystep_request (created_at);

-- A supervisor's children (run, step, time in step), published with its
-- heartbeat; NULL for runners that publish nothing.
ALTER TABLE everystep_runner ADD COLUMN detail json;
