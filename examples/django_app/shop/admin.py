from django.contrib import admin

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "sku", "quantity", "amount", "status", "run_id")
    list_filter = ("status",)
