"""A URLconf mounting the everystep console under other prefixes: twice,
the second time under its own instance namespace, as a project may."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/console/", include("everystep.contrib.django.console")),
    path("tools/es/", include("everystep.contrib.django.console", namespace="tools-console")),
]
