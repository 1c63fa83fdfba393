"""everystep's benchmark harness: ``python -m bench [--quick] [--database URL] [--out DIR]``.

One invocation starts (or uses) one PostgreSQL server and runs every case
against it: the database's physical limit (pgbench), everystep's throughput
at several ``--procs``, CPU scaling against the threaded worker, pickup
latency with and without LISTEN/NOTIFY, the peers (DBOS, Procrastinate),
the engine's overheads, and how cost grows: with history and queue depth
(case 7), with supervisors (case 8), beside a prune (case 9), and where a
run's time goes (case 10). It writes ``RESULTS.md`` and its charts.

Modules: ``runner`` (orchestration and the report document), ``report``
(sections, tables, the charts, drawn with matplotlib), ``pg`` (the server and machine facts), ``procs``
(processes under test), ``esdb`` (everystep's tables), ``stats``,
``workloads`` (the workflows), ``bulk`` (COPY loaders for large
histories and backlogs), ``fleet`` (supervisors under measurement, CPU and
wait sampling), ``peer_dbos`` and ``peer_procrastinate`` (the
peers' apps), and one ``caseN_*`` module per case.
"""
