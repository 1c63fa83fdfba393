"""The Celery worker's app for case 17 (``celery -A bench.celery_app
worker``): it imports the big app (``bench.bigapp``) in the worker's main
process, before the prefork pool forks, and runs the same task in it."""

from __future__ import annotations

from bench import bigapp
from bench.peer_celery import TASK, make_app

app = make_app()


@app.task(name=TASK)
def churn(seed: int) -> dict[str, int]:
    return bigapp.churn(seed)
