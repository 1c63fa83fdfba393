from django.db import models


class Order(models.Model):
    class Status(models.TextChoices):
        NEW = "new"
        RESERVED = "reserved"
        PAID = "paid"

    sku = models.CharField(max_length=50)
    quantity = models.PositiveIntegerField()
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.NEW)
    #: The everystep run fulfilling this order (scheduled in the same transaction).
    run_id = models.UUIDField(null=True, blank=True)
    charge_id = models.CharField(max_length=100, blank=True)

    def __str__(self) -> str:
        return f"order {self.pk}: {self.quantity} x {self.sku}"
