"""The shop's own tests, run by Django's test runner (``manage.py test shop``).

They show how a project tests code that schedules workflows: Django's test
database gets everystep's tables from ``migrate`` like any other, a run
scheduled in a test lives and dies with the test's transaction, and a
workflow called directly is a plain function (its steps are plain calls).
"""

import json

from django.db import transaction
from django.test import TestCase

import everystep
from everystep.errors import RunNotFound

from .models import Order
from .workflows import fulfil_order


class PlaceOrderTests(TestCase):
    def test_placing_an_order_schedules_its_fulfilment(self):
        response = self.client.post(
            "/orders/", json.dumps({"sku": "mug", "quantity": 1, "amount": "4.50"}), content_type="application/json"
        )
        self.assertEqual(response.status_code, 201)
        order = Order.objects.get(pk=response.json()["order"])
        run = everystep.get_run(str(order.run_id))
        self.assertEqual((run.name, run.args, run.status), (fulfil_order.name, [order.pk], "scheduled"))

    def test_a_failed_transaction_leaves_neither_order_nor_run(self):
        with self.assertRaises(ValueError):
            with transaction.atomic():
                order = Order.objects.create(sku="mug", quantity=1, amount="4.50")
                run = everystep.schedule(fulfil_order, order.pk)
                raise ValueError("card form invalid")
        self.assertFalse(Order.objects.exists())
        with self.assertRaises(RunNotFound):
            everystep.get_run(run.id)


class FulfilOrderTests(TestCase):
    def test_the_workflow_body_runs_as_a_plain_function(self):
        order = Order.objects.create(sku="tea", quantity=2, amount="7.00")
        self.assertEqual(fulfil_order(order.pk), {"sku": "tea", "charge": f"ch_{order.pk}_7.00"})
        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.PAID)
