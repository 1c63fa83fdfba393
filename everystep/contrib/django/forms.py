"""The admin's resolve form: the same three choices as ``everystep resolve-step``."""

from __future__ import annotations

from typing import Any

from django import forms

from everystep.cli.command import parse_json
from everystep.errors import EverystepError

RESULT, ERROR, DISCARD = "result", "error", "discard"


class ResolveStepForm(forms.Form):
    step_id = forms.CharField(label="Step", max_length=300)
    outcome = forms.ChoiceField(
        widget=forms.RadioSelect,
        choices=[
            (RESULT, "It happened: record this JSON value as the step's result"),
            (ERROR, "It happened and failed: record this error message (replay raises StepFailure)"),
            (DISCARD, "It did not happen: run the step again"),
        ],
    )
    value = forms.CharField(
        label="Result (JSON) or error message", required=False, widget=forms.Textarea(attrs={"rows": 4}),
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        outcome, value = data.get("outcome"), data.get("value", "")
        if outcome == RESULT:
            try:
                data["parsed"] = parse_json(value, "the result")
            except EverystepError as exc:
                self.add_error("value", str(exc))
        elif outcome == ERROR and not value.strip():
            self.add_error("value", "an error message is required")
        return data

    def resolution(self) -> dict[str, Any]:
        """Keyword arguments for ``everystep.admin.resolve_step``."""
        outcome = self.cleaned_data["outcome"]
        if outcome == RESULT:
            return {"result": self.cleaned_data["parsed"]}
        if outcome == ERROR:
            return {"error": self.cleaned_data["value"]}
        return {"discard": True}
