"""RESULTS.md and its charts (matplotlib, from the ``bench`` or ``test`` extra).

Each case returns a ``Section``: a title, a paragraph on method, one or more
tables and notes. A case that could not run still returns its section, with
a table saying why, so the report always has every case.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    caption: str = ""

    def add(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])

    def markdown(self) -> str:
        lines = []
        if self.caption:
            lines += [self.caption, ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        for row in self.rows:
            padded = row + [""] * (len(self.headers) - len(row))
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in padded) + " |")
        return "\n".join(lines)


@dataclass
class Section:
    key: str
    title: str
    method: str = ""
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def markdown(self) -> str:
        parts = [f"## {self.title}", ""]
        if self.method:
            parts += [self.method.strip(), ""]
        for table in self.tables:
            parts += [table.markdown(), ""]
        for note in self.notes:
            parts.append(f"- {note}")
        if self.notes:
            parts.append("")
        if self.seconds:
            parts.append(f"_Case wall time: {self.seconds:.0f} s._")
        parts.append("")
        return "\n".join(parts)


def failed_section(key: str, title: str, error: str) -> Section:
    table = Table(["status", "detail"])
    table.add("not measured", error.strip().splitlines()[0] if error.strip() else "unknown error")
    section = Section(key, title, tables=[table])
    detail = error.strip()
    if detail:
        section.notes.append("Error output:\n\n```\n" + detail[-3000:] + "\n```")
    return section


@dataclass
class ChartSeries:
    label: str
    points: list[tuple[float, float]]
    #: min–max of the repetitions at each x, drawn as error bars.
    ranges: dict[float, tuple[float, float]] = field(default_factory=dict)


def write_chart(path: Path, title: str, xlabel: str, ylabel: str, series: Sequence[ChartSeries],
                log_y: bool = True, log_x: bool = False) -> str:
    """Write a line chart (medians with min–max bars) as a PNG; returns what drew it."""
    series = [s for s in series if s.points]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    markers = "osD^vx*"
    for index, item in enumerate(series):
        points = sorted(item.points)
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        lows = [y - item.ranges.get(x, (y, y))[0] for x, y in points]
        highs = [item.ranges.get(x, (y, y))[1] - y for x, y in points]
        ax.errorbar(xs, ys, yerr=[lows, highs], fmt=("-" if len(xs) > 1 else "") + markers[index % len(markers)],
                    capsize=4, label=item.label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    if log_x:
        ax.set_xscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.0f}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _pos: ""))
    xs_all = sorted({p[0] for s in series for p in s.points})
    if xs_all:
        ax.set_xticks(xs_all)
        ax.set_xticklabels([f"{x:,.0f}" if x >= 1000 else f"{x:g}" for x in xs_all])
    ax.grid(True, which="both", alpha=0.3)
    if series:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.text(0.01, 0.01, "markers: medians; bars: min–max of the repetitions", fontsize=7, color="grey")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return "matplotlib"
