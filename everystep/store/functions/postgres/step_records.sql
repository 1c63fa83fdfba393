-- The step records a runner writes for every run (record_step,
-- finish_run_with_step and their forms with a patch marker), as functions,
-- for connections behind a transaction pooler (?pooler=transaction).
--
-- Why. A direct connection prepares these statements once per session
-- (store/postgres_hot.py) and runs them on generic plans. Behind a
-- transaction pooler nothing stays prepared, so each one was sent whole and
-- PostgreSQL parsed and planned it on every call: planning alone took
-- 0.7 ms of the server's time per 3-step run, about what executing them
-- takes (case 16; docs/explanation/performance.md). A PL/pgSQL
-- function's statements are parsed once per server session and their plans
-- kept there (as a prepared statement's), whichever client's transaction
-- calls it, so through the pooler only the short call is parsed.
--
-- What. Each body is the named statement itself ({statement:...}: the
-- text of store/queries/postgres.sql, rendered when this file is read, its
-- parameters as the p_ arguments), so there is one statement to change and
-- the migrator re-applies this file when it changes. The arguments are the
-- statement's parameters, named alike with p_, of the types the server
-- infers for them (the store calls these in named notation:
-- PostgresStore, and tests/test_poolers.py checks the names). The result
-- columns are the statement's; #variable_conflict use_column because they
-- share names with the tables' columns. No SET clauses: the plans chosen
-- are the ones a prepared statement gets (plan_cache_mode auto), and a SET
-- clause would cost every call a configuration change.

CREATE OR REPLACE FUNCTION everystep_record_step(
    p_run_id uuid, p_step_id text, p_name text, p_args json, p_kwargs json, p_status text, p_result json,
    p_error json, p_started_at timestamptz, p_attempt integer, p_wake_at timestamptz, p_cpu_seconds float8,
    p_peak_rss_bytes bigint, p_claimer text, p_claim_epoch bigint)
RETURNS TABLE (completed_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
{statement:record_step};
END;
$$;

CREATE OR REPLACE FUNCTION everystep_record_step_marked(
    p_run_id uuid, p_marker_id text, p_marker_name text, p_marker_args json, p_marker_result json,
    p_claimer text, p_claim_epoch bigint, p_step_id text, p_name text, p_args json, p_kwargs json,
    p_status text, p_result json, p_error json, p_started_at timestamptz, p_attempt integer,
    p_wake_at timestamptz, p_cpu_seconds float8, p_peak_rss_bytes bigint)
RETURNS TABLE (step_id text, completed_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
{statement:record_step_marked};
END;
$$;

CREATE OR REPLACE FUNCTION everystep_finish_run_with_step(
    p_run_id uuid, p_claimer text, p_claim_epoch bigint, p_step_id text, p_name text, p_args json,
    p_kwargs json, p_step_status text, p_step_result json, p_step_error json, p_started_at timestamptz,
    p_attempt integer, p_wake_at timestamptz, p_cpu_seconds float8, p_peak_rss_bytes bigint,
    p_status text, p_result json, p_error json)
RETURNS TABLE (completed_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
{statement:finish_run_with_step};
END;
$$;

CREATE OR REPLACE FUNCTION everystep_finish_run_with_step_marked(
    p_run_id uuid, p_claimer text, p_claim_epoch bigint, p_marker_id text, p_marker_name text,
    p_marker_args json, p_marker_result json, p_step_id text, p_name text, p_args json, p_kwargs json,
    p_step_status text, p_step_result json, p_step_error json, p_started_at timestamptz, p_attempt integer,
    p_wake_at timestamptz, p_cpu_seconds float8, p_peak_rss_bytes bigint, p_status text, p_result json,
    p_error json)
RETURNS TABLE (completed_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
{statement:finish_run_with_step_marked};
END;
$$;
