"""The report: one Markdown table per row family, and the page around them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

NONE = "—"


@dataclass(frozen=True)
class Row:
    measure: str
    """Which case: a size, a mode, a concurrency."""
    figure: str
    """With Berth (or the only figure, when nothing is compared)."""
    baseline: str = NONE
    """Without Berth, measured in the same run."""
    ratio: float | None = None
    n: str = NONE
    """How many things the figure is measured over (pods, requests, jobs, rounds)."""
    what: str = ""
    """One line: what this measures."""


@dataclass(frozen=True)
class Table:
    title: str
    method: str
    """How the rows were measured, in a few sentences."""
    rows: list[Row] = field(default_factory=list)
    figure_header: str = "with Berth"
    baseline_header: str | None = "without"
    """None: nothing is compared, the table has no baseline column."""
    ratio_header: str | None = "ratio"
    """None: the table has no ratio column."""


def ratio_text(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}"


def number(value: float, unit: str = "") -> str:
    """A figure to three significant digits or so, with thousands separators."""
    if value >= 100:
        text = f"{value:,.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".rstrip()


def added(seconds: float | None, per: str) -> str:
    """The time each event takes more with Berth, e.g. " (+1.62 ms a pod)"; "" if unknown."""
    if seconds is None:
        return ""
    return f" ({seconds * 1000:+.2f} ms a {per})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(table: Table) -> str:
    headers = [
        "measure",
        table.figure_header,
        *([table.baseline_header] if table.baseline_header else []),
        *([table.ratio_header] if table.ratio_header else []),
        "n",
        "what this measures",
    ]
    lines = [
        f"## {table.title}",
        "",
        table.method,
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    for row in table.rows:
        cells = [
            row.measure,
            row.figure,
            *([row.baseline] if table.baseline_header else []),
            *([ratio_text(row.ratio)] if table.ratio_header else []),
            row.n,
            row.what,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render_results(
    *, machine: Sequence[tuple[str, str]], notes: Sequence[str], tables: Sequence[Table]
) -> str:
    """bench/RESULTS.md: where and when it was measured, then every table."""
    lines = ["# Benchmark results", "", "Written by `make bench` (`bench/run.py`).", ""]
    lines += [f"- **{key}**: {value}" for key, value in machine]
    for note in notes:
        lines += ["", note]
    lines.append("")
    return "\n".join(lines) + "\n" + "\n".join(render_table(t) for t in tables)
