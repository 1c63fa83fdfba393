"""The Django admin: read-only runs and steps, and resolving blocked runs.

Nothing here writes through the ORM. Lists and details read the unmanaged
models; resolving a blocked run calls ``everystep.admin.resolve_step``, the
function behind ``everystep resolve-step``, so the admin refuses exactly
what the command refuses (with the same messages). It needs the
``everystep.resolve_step`` permission (superusers have it).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from everystep import admin as operations
from everystep.errors import EverystepError
from everystep.models import BLOCKED, RUN_STATUSES, STEP_DONE, STEP_STARTED, StepStatus

from . import database
from .forms import ResolveStepForm
from .models import Run, Step


def _pretty(value: Any) -> str:
    if value is None:
        return "-"
    return format_html("<pre style=\"margin:0;white-space:pre-wrap\">{}</pre>",
                       json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False))


def _error_line(error: Any) -> str:
    if not error:
        return ""
    if isinstance(error, dict):
        return f"{error.get('type', '?')}: {error.get('message', '')}"
    return str(error)


class StatusFilter(admin.SimpleListFilter):
    """everystep's statuses, listed without scanning the table."""

    title = "status"
    parameter_name = "status"
    statuses: tuple[str, ...] = RUN_STATUSES

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(status, status) for status in self.statuses]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(status=self.value()) if self.value() else queryset


class StepStatusFilter(StatusFilter):
    statuses = tuple(StepStatus)


def _as_uuid(term: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(term.strip())
    except ValueError:
        return None


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepInline(admin.TabularInline):
    model = Step
    fk_name = "run"
    ordering = ["id"]
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("step_id", "name", "status", "outcome", "started_at", "completed_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="outcome")
    def outcome(self, step: Step) -> str:
        if step.status == STEP_DONE:
            text = json.dumps(step.result, ensure_ascii=False)
            return text if len(text) <= 80 else text[:77] + "..."
        return _error_line(step.error)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "status", "claimed_by", "created_at", "completed_at")
    list_filter = (StatusFilter,)
    search_fields = ("name", "idempotency_key")
    search_help_text = "A run id (whole or its first characters), a workflow name or an idempotency key"
    list_per_page = 50
    show_full_result_count = False  # counting millions of finished runs on every page is slow
    fields = ("id", "name", "status", "args_json", "idempotency_key", "claimed_by", "claimed_at",
              "result_json", "error_json", "created_at", "completed_at")
    readonly_fields = fields
    inlines = [StepInline]
    actions = ["resolve_blocked_step"]

    @admin.display(description="args")
    def args_json(self, run: Run) -> str:
        return _pretty(run.args)

    @admin.display(description="result")
    def result_json(self, run: Run) -> str:
        return _pretty(run.result)

    @admin.display(description="error")
    def error_json(self, run: Run) -> str:
        return _pretty(run.error)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Run], search_term: str) -> Any:
        """A whole run id is an exact (indexed) match; the start of one a
        prefix match; anything else searches names and idempotency keys."""
        run_id = _as_uuid(search_term)
        if run_id is not None:
            return queryset.filter(id=run_id), False
        found, duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().lower()
        if len(term) >= 4 and all(char in "0123456789abcdef-" for char in term):
            found = found | queryset.filter(id__startswith=term)
        return found, duplicates

    # -- resolving a blocked run -----------------------------------------------

    def has_resolve_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.resolve_step")

    @admin.action(description="Resolve the blocked step of the selected run", permissions=["resolve"])
    def resolve_blocked_step(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        runs = list(queryset[:2])
        if len(runs) != 1:
            self.message_user(request, "Select exactly one run to resolve.", messages.ERROR)
            return None
        return HttpResponseRedirect(self._resolve_url(runs[0]))

    def _resolve_url(self, run: Run) -> str:
        return reverse(f"{self.admin_site.name}:everystep_run_resolve", args=[str(run.pk)])

    def get_urls(self) -> list[Any]:
        resolve = path("<path:object_id>/resolve/", self.admin_site.admin_view(self.resolve_view),
                       name="everystep_run_resolve")
        return [resolve, *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        run = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if run is not None and run.status == BLOCKED and self.has_resolve_permission(request, run):
            context["resolve_url"] = self._resolve_url(run)
        return super().change_view(request, object_id, form_url, extra_context=context)

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404(f"no run with id {object_id}")
        if not self.has_resolve_permission(request, run):
            raise PermissionDenied
        started = [step.step_id for step in run.steps.filter(status=STEP_STARTED).order_by("id")]
        if request.method == "POST":
            form = ResolveStepForm(request.POST)
            if form.is_valid():
                step_id = form.cleaned_data["step_id"]
                try:
                    resolved = operations.resolve_step(database.store(), str(run.pk), step_id, **form.resolution())
                except EverystepError as exc:
                    form.add_error(None, str(exc))
                else:
                    outcome = form.cleaned_data["outcome"]
                    self.log_change(request, run, f"Resolved step {step_id} ({outcome}); run is {resolved.status}")
                    self.message_user(request, f"Run {resolved.id} resolved at step {step_id}; now {resolved.status}.",
                                      messages.SUCCESS)
                    return HttpResponseRedirect(reverse(f"{self.admin_site.name}:everystep_run_change",
                                                        args=[str(run.pk)]))
        else:
            form = ResolveStepForm(initial={"step_id": started[0] if started else "", "outcome": "discard"})
        context = {
            **self.admin_site.each_context(request),
            "title": f"Resolve the blocked step of run {run.pk}",
            "opts": self.opts,
            "original": run,
            "run": run,
            "started_steps": started,
            "form": form,
            "blocked": run.status == BLOCKED,
            "error_line": _error_line(run.error),
        }
        return TemplateResponse(request, "admin/everystep/run/resolve_step.html", context)


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ("step_id", "run_link", "name", "status", "started_at", "completed_at")
    list_filter = (StepStatusFilter,)
    search_fields = ("step_id", "name")
    search_help_text = "A run id (its steps), a step id or a function name"
    list_per_page = 100
    show_full_result_count = False
    fields = ("run_link", "step_id", "name", "status", "args_json", "kwargs_json", "result_json", "error_json",
              "started_at", "completed_at")
    readonly_fields = fields

    @admin.display(description="run", ordering="run_id")
    def run_link(self, step: Step) -> str:
        url = reverse(f"{self.admin_site.name}:everystep_run_change", args=[str(step.run_id)])
        return format_html('<a href="{}">{}</a>', url, step.run_id)

    @admin.display(description="args")
    def args_json(self, step: Step) -> str:
        return _pretty(step.args)

    @admin.display(description="kwargs")
    def kwargs_json(self, step: Step) -> str:
        return _pretty(step.kwargs)

    @admin.display(description="result")
    def result_json(self, step: Step) -> str:
        return _pretty(step.result)

    @admin.display(description="error")
    def error_json(self, step: Step) -> str:
        return _pretty(step.error)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Step], search_term: str) -> Any:
        run_id = _as_uuid(search_term)
        if run_id is not None:
            return queryset.filter(run_id=run_id), False
        return super().get_search_results(request, queryset, search_term)
