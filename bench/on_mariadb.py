"""MariaDB: cases 2 and 4 on a MariaDB server, against a MariaDB baseline
measured in the same run.

- Baseline (case 1's role): N client processes, each committing a one-row
  INSERT per transaction (PyMySQL, autocommit) for the same number of
  seconds as pgbench does in case 1, at the same client counts as case 2's
  ``--procs``. MariaDB ships no pgbench; the clients use the driver
  everystep uses, so the ratio compares like with like.
- Case 2: the same burst of ``noop3`` runs at each ``--procs``, rates over
  the database-stamped window (first ``claimed_at`` to last
  ``completed_at``). Baseline and burst repetitions interleave.
- Case 4: runs arriving one at a time at an idle ``--procs 2``
  supervisor. MariaDB has no LISTEN/NOTIFY; by default ``schedule()``
  interrupts the supervisor's wake-up connection (``store/mariadb_wake.py``),
  measured with the default ``--poll 0.5``; polling only (``?wake=off``)
  with ``--poll 0.2`` (case 4's polling row) and ``--poll 0.5``.

The server is the one ``EVERYSTEP_TEST_MARIADB_URL`` names, else the local
one at 127.0.0.1:3306, else a throwaway ``mariadbd`` (see
``tests.support.mariadbserver``); with none, the section says so and the
run does not fail.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

from everystep import schedule
from everystep.store import connect

from . import procs
from .context import Context
from .report import Section, Table
from .stats import Series, fmt, fmt_ratio, percentile
from .workloads import noop3, payload, stamp1

APP = "bench.workloads"
LATENCY_PROCS = 2
TABLES = ("everystep_stream", "everystep_attempt", "everystep_step", "everystep_message", "everystep_event",
          "everystep_workflow", "everystep_runner", "everystep_request", "everystep_cron")


def _raw(url: str, autocommit: bool = True) -> Any:
    # Imported on use: without PyMySQL (the bench or mariadb extra) the
    # other cases still run and this one says why it did not.
    import pymysql

    from everystep.store.mariadb import connect_args

    return pymysql.connect(**connect_args(url), autocommit=autocommit)


# -- baseline ---------------------------------------------------------------------------------


def _insert_client(url: str, start_at: float, seconds: float, counts: Any) -> None:
    conn = _raw(url)
    cursor = conn.cursor()
    done = 0
    time.sleep(max(0.0, start_at - time.time()))
    deadline = start_at + seconds
    while time.time() < deadline:
        cursor.execute("INSERT INTO bench_insert (payload) VALUES ('x')")
        done += 1
    counts.put(done)
    conn.close()


def baseline(url: str, clients: int, seconds: float) -> float:
    """Commits per second of ``clients`` processes, one-row INSERT each."""
    with _raw(url) as conn, conn.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_insert "
                       "(id BIGINT AUTO_INCREMENT PRIMARY KEY, payload TEXT NOT NULL) ENGINE = InnoDB")
        cursor.execute("TRUNCATE bench_insert")
    context = multiprocessing.get_context("fork")
    counts = context.Queue()
    start_at = time.time() + 0.5  # every client connected before the clock starts
    workers = [context.Process(target=_insert_client, args=(url, start_at, seconds, counts)) for _ in range(clients)]
    for worker in workers:
        worker.start()
    total = sum(counts.get(timeout=seconds + 60) for _ in workers)
    for worker in workers:
        worker.join(30)
    return total / seconds


# -- case 2 -------------------------------------------------------------------------------------


def _reset(url: str) -> None:
    with _raw(url) as conn, conn.cursor() as cursor:
        cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        for table in TABLES:
            cursor.execute(f"TRUNCATE {table}")
        cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def _fill(url: str, runs: int) -> None:
    conn = _raw(url, autocommit=False)
    try:
        for i in range(runs):
            schedule(noop3, payload(i), conn=conn)
        conn.commit()
    finally:
        conn.close()


def _span(url: str) -> tuple[int, int, int, float]:
    with _raw(url) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT sum(status = 'completed'), sum(status <> 'completed'),"
                       " TIMESTAMPDIFF(MICROSECOND, min(claimed_at), max(completed_at)) / 1000000.0"
                       " FROM everystep_workflow")
        completed, other, seconds = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM everystep_step WHERE status = 'done'")
        (steps,) = cursor.fetchone()
    return int(completed or 0), int(other or 0), int(steps), float(seconds or 0.0)


def burst(ctx: Context, url: str, procs_: int, runs: int) -> dict[str, float]:
    _reset(url)
    _fill(url, runs)
    cmd = procs.supervisor_cmd(url, procs_, ctx.work.socket(), app=APP)
    wall = procs.run(cmd, ctx.work.log(f"supervisor-mariadb-p{procs_}"), timeout=60 + runs * 0.5)
    completed, other, steps, seconds = _span(url)
    if completed != runs or other:
        raise procs.BenchError(f"MariaDB --procs {procs_}: {completed} of {runs} runs completed ({other} other)")
    return {"runs_per_s": completed / seconds, "steps_per_s": steps / seconds, "wall": wall}


# -- case 4 -------------------------------------------------------------------------------------


#: Pickup configurations: (label, --poll or None for the default, wake-up on).
PICKUPS = (("wake-up (default), default --poll 0.5", None, True), ("polling only, --poll 0.2", 0.2, False),
           ("polling only, default --poll 0.5", None, False))


def pickup(ctx: Context, url: str, runs: int, poll: float | None, gap: tuple[float, float],
           wake: bool = True) -> list[float]:
    """Milliseconds from schedule() returning to the first step starting."""
    _reset(url)
    socket_path = ctx.work.socket()
    extra = ["--poll", f"{poll:g}"] if poll is not None else []
    url = url if wake else f"{url}?wake=off"
    cmd = procs.supervisor_cmd(url, LATENCY_PROCS, socket_path, app=APP, burst=False, extra=extra)
    proc = procs.Proc(cmd, ctx.work.log(f"supervisor-mariadb-latency-{poll}-{'wake' if wake else 'poll'}"))
    store = connect(url)
    rng = random.Random(6)
    sent: dict[str, float] = {}
    try:
        procs.wait_children_idle(socket_path, LATENCY_PROCS)
        for _ in range(runs):
            run_id = schedule(stamp1, database=store).id
            sent[run_id] = time.time()
            time.sleep(rng.uniform(*gap))
        deadline = time.monotonic() + 60
        while store.count_runs(status="completed") < runs:
            if time.monotonic() > deadline:
                raise procs.BenchError(f"MariaDB pickup: not every run completed within 60 s (poll {poll})")
            time.sleep(0.05)
    finally:
        proc.stop()
        store.close()
    with _raw(url) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT workflow_id, result FROM everystep_step WHERE step_id = '1'")
        stamps = {run_id: float(result) for run_id, result in cursor.fetchall()}
    return [(stamps[run_id] - after) * 1000.0 for run_id, after in sent.items() if run_id in stamps]


# -- the case ---------------------------------------------------------------------------------


def run(ctx: Context) -> None:
    s = ctx.settings
    out = ctx.results.setdefault("mariadb", {})
    try:
        from tests.support.mariadbserver import start_server
    except ImportError as exc:
        ctx.errors["mariadb_unavailable"] = f"PyMySQL is not installed (pip install 'everystep[bench]'): {exc}"
        ctx.log(f"MariaDB: not measured ({ctx.errors['mariadb_unavailable']})")
        return
    server, why = start_server()
    if server is None:
        ctx.errors["mariadb_unavailable"] = why
        ctx.log(f"MariaDB: not measured ({why})")
        return
    urls: list[str] = []
    try:
        es_url = server.create_database("bench_es")
        base_url = server.create_database("bench_insert")
        urls += [es_url, base_url]
        store = connect(es_url)
        store.migrate()
        store.close()
        with _raw(es_url) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT @@version, @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin")
            out["server"] = cursor.fetchone()
        for rep in range(s.reps):
            for clients in s.procs:
                tps = baseline(base_url, clients, s.pgbench_seconds)
                out.setdefault(("baseline", clients), Series()).add(tps)
                ctx.log(f"MariaDB rep {rep + 1}: one-row INSERT, {clients} clients: {tps:,.0f} commits/s")
                m = burst(ctx, es_url, clients, s.throughput_runs)
                for key, value in m.items():
                    out.setdefault((key, clients), Series()).add(value)
                out.setdefault(("step_ratio", clients), Series()).add(m["steps_per_s"] / tps)
                ctx.log(f"MariaDB rep {rep + 1}: --procs {clients}: {m['runs_per_s']:,.0f} runs/s, "
                        f"{m['steps_per_s']:,.0f} step commits/s")
        for label, poll, wake in PICKUPS:
            latencies = pickup(ctx, es_url, s.latency_poll_runs, poll, s.poll_gap, wake)
            out[("pickup", label)] = latencies
            ctx.log(f"MariaDB pickup ({label}): p50 {percentile(latencies, 50) or 0:.1f} ms")
    finally:
        for url in urls:
            server.drop_database(url)
        server.close()


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("mariadb", {})
    section = Section(
        "mariadb", "MariaDB — cases 2 and 4 on MariaDB, against a MariaDB baseline",
        method=(
            f"The same workloads as cases 2 and 4, on a MariaDB server. Baseline (case 1's role): N client "
            f"processes each committing `INSERT INTO bench_insert (payload) VALUES ('x')` in autocommit "
            f"(PyMySQL) for {s.pgbench_seconds:g} s, at the client counts of case 2, each repetition just before "
            f"the burst it is paired with. Case 2: {s.throughput_runs:,} `noop3` runs filled in one transaction "
            "(`schedule(conn=<PyMySQL connection>)`), worked off by `everystep-supervisor --burst`; rates over "
            "the database-stamped window. Case 4, with the wake-up and polling only: "
            f"{s.latency_poll_runs} runs of `stamp1` scheduled with `schedule()` one at a time (gaps "
            f"{s.poll_gap[0] * 1000:.0f}–{s.poll_gap[1] * 1000:.0f} ms) at an idle `--procs {LATENCY_PROCS}` "
            "supervisor."
        ),
    )
    if "mariadb_unavailable" in ctx.errors:
        table = Table(["MariaDB", "result"])
        table.add("not measured", ctx.errors["mariadb_unavailable"])
        section.tables.append(table)
        return section
    server = out.get("server")
    if server:
        section.notes.append(f"Server: MariaDB {server[0]}, `innodb_flush_log_at_trx_commit={server[1]}`, "
                             f"`sync_binlog={server[2]}`, `log_bin={server[3]}` (its own durability settings).")
    table = Table(["--procs / clients", "runs/s", "step commits/s", "baseline commits/s (same clients)",
                   "step commits / baseline", "burst wall s"],
                  caption="Case 2 on MariaDB:")
    for clients in s.procs:
        ratio = out.get(("step_ratio", clients), Series())
        table.add(clients, out.get(("runs_per_s", clients), Series()).cell(0),
                  out.get(("steps_per_s", clients), Series()).cell(0),
                  out.get(("baseline", clients), Series()).cell(0),
                  fmt_ratio(ratio.median, percent=True) if ratio else "n/a",
                  out.get(("wall", clients), Series()).cell(1))
    section.tables.append(table)
    latency = Table(["pickup by", "runs", "p50 ms", "p99 ms", "max ms"], caption="Case 4 on MariaDB (pickup latency):")
    for label, _poll, _wake in PICKUPS:
        values = out.get(("pickup", label))
        if not values:
            latency.add(label, 0, "n/a", "n/a", "n/a")
            continue
        latency.add(label, len(values), fmt(percentile(values, 50), 1), fmt(percentile(values, 99), 1),
                    fmt(max(values), 1))
    section.tables.append(latency)
    return section
