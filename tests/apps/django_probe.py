"""A workflow for the Django supervisor test, run by ``manage.py
everystep_supervisor --app tests.apps.django_probe``: its first step tells
whether the child began with Django's connection already open (inherited
from the parent across ``fork()``), then queries through the ORM."""

from __future__ import annotations

import os
from typing import Any

from everystep import step, workflow


@step
def look_at_djangos_connection() -> dict[str, Any]:
    from django.db import connection

    return {"pid": os.getpid(), "ppid": os.getppid(), "inherited_open": connection.connection is not None}


@step
def count_orders() -> int:
    from shop.models import Order

    return Order.objects.count()


@workflow
def probe() -> dict[str, Any]:
    seen = look_at_djangos_connection()
    return {**seen, "orders": count_orders()}
