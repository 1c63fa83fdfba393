"""The supervisor's JSON logs (``--log-format json``): every line is one
JSON object with a level, a message and a pid, and each run's lifecycle
line carries its run id, workflow and the pid of the child that ran it.
"""

from __future__ import annotations

import json

import pytest

from everystep import schedule
from everystep.models import COMPLETED, FAILED
from tests.apps import observed
from tests.apps.observed import APP
from tests.support.supervisor import supervisors, wait_run  # noqa: F401 - supervisors is a fixture

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]


def test_supervisor_json_logs_carry_run_workflow_and_child_pid(db_url, store, supervisors, tmp_path):
    # Completed runs are logged at DEBUG (a burst must not flood the log).
    sup = supervisors(db_url, procs=2, app=APP, args=["--log-format", "json", "--log-level", "debug"]).start()
    children = {child["pid"] for child in sup.status()["children"]}
    runs = [schedule(observed.quick, {"dir": str(tmp_path)}, database=store) for _ in range(3)]
    for run in runs:
        assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    assert sup.stop() == 0

    lines = [line for line in sup.log().splitlines() if line.strip()]
    records = []
    for line in lines:
        record = json.loads(line)
        assert isinstance(record, dict), line
        assert {"level", "message", "pid"} <= set(record), line
        assert record["level"] in {"debug", "info", "warning", "error", "critical"}
        records.append(record)
    for run in runs:
        ran_in = store.get_steps(run.id)[0].result
        [done] = [record for record in records if record.get("run_id") == run.id
                  and record.get("event") == "run_completed"]
        assert done["workflow"] == observed.quick.name
        assert done["pid"] == sup.pid, "the parent logs the lifecycle"
        assert done["child_pid"] == ran_in
        assert ran_in in children
        assert run.id in done["message"]
    started = {record["child_pid"] for record in records if record.get("event") == "child_started"}
    assert children <= started
