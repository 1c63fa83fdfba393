from everystep import schedule, step, workflow
from everystep.models import COMPLETED
from tests.support.runs import execute_run


@step
def double(x):
    return x * 2


@workflow
def smoke(n):
    return double(double(n))


def test_smoke_run_completes(store):
    run = schedule(smoke, 3, database=store)
    assert execute_run(store, run.id) == COMPLETED
    done = store.get_run(run.id)
    assert done.result == 12
    assert [s.step_id for s in store.get_steps(run.id)] == ["1", "2"]
