"""The console's URLs, the same paths as ``everystep ui`` serves."""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "everystep_console"

urlpatterns = [
    path("", views.page, {"page": "runs"}, name="runs"),
    path("runs/<uuid:run_id>", views.page, {"page": "run"}, name="run"),
    path("runners", views.page, {"page": "runners"}, name="runners"),
    path("blocked", views.page, {"page": "blocked"}, name="blocked"),
    path("api/meta", views.meta, name="meta"),
    path("api/runs", views.view, {"view": "runs"}, name="api-runs"),
    path("api/runs/<str:run_id>", views.view, {"view": "run"}, name="api-run"),
    path("api/runs/<str:run_id>/steps", views.view, {"view": "steps"}, name="api-run-steps"),
    path("api/runners", views.view, {"view": "runners"}, name="api-runners"),
    path("api/blocked", views.view, {"view": "blocked"}, name="api-blocked"),
    path("api/stream", views.stream, name="api-stream"),
    path("api/runs/<str:run_id>/streams/<path:key>", views.run_stream, name="api-run-stream"),
    path("api/requests/<str:request_id>", views.operator_request, name="api-request"),
    path("api/requests/<str:request_id>/expire", views.expire_request, name="api-request-expire"),
    path("api/runs/<str:run_id>/<str:action>", views.run_action, name="api-run-action"),
    path("api/runners/<str:name>/<str:command>", views.runner_action, name="api-runner-action"),
    path("static/<path:name>", views.static, name="static"),
]
