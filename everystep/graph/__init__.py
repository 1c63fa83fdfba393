"""The step graph of a run: what its body will do (``plan``, read from the
source) overlaid with what it did (``overlay``, from the recorded steps)."""

from __future__ import annotations

from .overlay import build_graph
from .plan import Plan, analyse
from .recorded import recorded_graph

__all__ = ["Plan", "analyse", "build_graph", "recorded_graph"]
