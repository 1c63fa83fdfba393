from django.contrib import admin
from django.urls import include, path

from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    # The everystep console (runs, step graphs, runners, blocked runs), for
    # users with the everystep.view_run permission; acting needs
    # everystep.operate_console.
    path("everystep/", include("everystep.contrib.django.console")),
    path("orders/", views.place_order, name="place-order"),
    path("orders/<int:order_id>/", views.order_status, name="order-status"),
]
