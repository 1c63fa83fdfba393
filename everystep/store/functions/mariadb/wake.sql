-- MariaDB has no LISTEN/NOTIFY. An idle runner's wake-up connection waits
-- in SELECT SLEEP(...) AS everystep_wake (mariadb.sql: wake_wait), and
-- schedule() calls this once its run is committed: it interrupts those
-- sleeps (KILL QUERY), so the runners claim at once instead of at their
-- next poll. Only the sleeps of this database, and only those this
-- session may see and end (SQL SECURITY INVOKER: its own user's, or all
-- with the PROCESS and CONNECTION ADMIN privileges); one it may not end is
-- left to its poll.

CREATE OR REPLACE PROCEDURE everystep_wake()
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN -- $$
    FOR sleeper IN (SELECT ID FROM information_schema.PROCESSLIST
                    WHERE COMMAND = 'Query' AND DB = DATABASE() AND ID <> CONNECTION_ID()
                      AND INFO LIKE 'SELECT SLEEP(%) AS everystep_wake') DO
        BEGIN
            DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;  -- gone meanwhile, or not ours to end
            KILL QUERY sleeper.ID;
        END;
    END FOR;
END -- $$
;
