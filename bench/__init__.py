"""everystep's benchmark harness: ``python -m bench [--quick] [--database URL] [--out DIR]``.

One invocation starts (or uses) one PostgreSQL server and runs every case
against it: the database's physical limit (pgbench), everystep's throughput
at several ``--procs``, CPU scaling against the threaded worker, pickup
latency with and without LISTEN/NOTIFY, the peers (DBOS, Procrastinate) and
the engine's overheads. It writes ``RESULTS.md`` and ``throughput.png``.

Modules: ``runner`` (orchestration and the report document), ``report``
(sections, tables, the charts, drawn with matplotlib), ``pg`` (the server and machine facts), ``procs``
(processes under test), ``esdb`` (everystep's tables), ``stats``,
``workloads`` (the workflows), ``peer_dbos`` and ``peer_procrastinate`` (the
peers' apps), and one ``caseN_*`` module per case.
"""
