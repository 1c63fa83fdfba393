"""Placing an order schedules its fulfilment in the same transaction: if
anything fails before the commit, neither the order nor the run exists."""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

import everystep

from .models import Order
from .workflows import fulfil_order


@csrf_exempt  # an example JSON API; a real one authenticates its clients
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    try:
        data = json.loads(request.body)
        sku, quantity, amount = str(data["sku"]), int(data["quantity"]), Decimal(str(data["amount"]))
    except (ValueError, KeyError, TypeError, InvalidOperation):
        return JsonResponse({"error": "expected {\"sku\": ..., \"quantity\": ..., \"amount\": ...}"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(sku=sku, quantity=quantity, amount=amount)
        run = everystep.schedule(fulfil_order, order.pk)
        order.run_id = run.id
        order.save(update_fields=["run_id"])
    return JsonResponse({"order": order.pk, "run": run.id}, status=201)


@require_GET
def order_status(request: HttpRequest, order_id: int) -> JsonResponse:
    order = get_object_or_404(Order, pk=order_id)
    run = everystep.get_run(str(order.run_id)) if order.run_id else None
    return JsonResponse({"order": order.pk, "status": order.status, "run": run and run.status})
