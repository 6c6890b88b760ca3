"""The sections of ``report.md``, one function each: ``section(report) -> str | None`` takes the
:class:`Report` (the loaded runs and what was derived from them) and returns markdown, or ``None`` when it
has nothing to say. :data:`SECTIONS` lists them in order; a new section is a function appended there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specexp.analysis.groups import GROUP_KEY, GROUP_LABEL, device_of
from specexp.analysis.theory import _column, with_theory

MIB = 1024 ** 2
SPEEDUP_NOTE = (
    "Speedup = output tokens/s ÷ the k=0 run of the same group. Theory: Leviathan et al. with α fitted to the "
    "per-position counts and c = draft forward ÷ target decode step (see `specexp.analysis.theory`)."
)
SUMMARY_COLUMNS = {
    "group": "group",
    "k": "k",
    "acceptance_length": "acceptance length",
    "theory_acceptance_length": "theory AL",
    "per_position": "per-position acceptance",
    "output_tokens_per_s": "tokens/s",
    "speedup": "speedup",
    "theory_speedup": "theory speedup",
    "tpot_ms.p50": "TPOT p50 (ms)",
    "graph_memory_mib": "graph memory (MiB)",
}


@dataclass
class Report:
    """What the sections read: ``runs`` (every loaded run, with group columns), ``table``
    (:func:`summary_table`), ``fits`` (:func:`specexp.analysis.theory.fit_theory`), ``groups``
    (:func:`specexp.analysis.groups.group_table`), ``sources`` (the paths given), ``skipped`` ((run_dir,
    reason) of unusable records), ``figures`` (name -> PNG path) and ``failures`` ((what, one-line reason)
    of figures or sections that could not be made)."""

    runs: pd.DataFrame
    table: pd.DataFrame
    fits: pd.DataFrame
    groups: pd.DataFrame
    sources: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)


def fmt(value, digits: int = 2) -> str:
    """A table cell: floats to ``digits`` places, "–" for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def cell(text) -> str:
    """``text`` safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[list[str]], header: list[str]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def _positions(values) -> str:
    if not isinstance(values, (list, tuple)) or not values:
        return "–"
    return " ".join(fmt(v) for v in values)


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per finished run with the columns of :data:`SUMMARY_COLUMNS` (numbers, unformatted),
    sorted by group (in first-appearance order) and k."""
    runs = with_theory(df)
    if runs.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    runs["per_position"] = runs.get("per_position_acceptance")
    runs["graph_memory_mib"] = _column(runs, "graph_capture_bytes") / MIB
    order = {key: i for i, key in enumerate(dict.fromkeys(runs[GROUP_KEY]))}
    runs = runs.assign(_order=runs[GROUP_KEY].map(order)).sort_values(["_order", "k"], kind="stable")
    return runs[[c for c in SUMMARY_COLUMNS if c in runs]].reset_index(drop=True)


def summary_markdown(table: pd.DataFrame) -> str:
    """:func:`summary_table` as markdown ("–" for values not measured, e.g. graph memory on CPU)."""
    rows = []
    for _, row in table.iterrows():
        cells = []
        for column in table.columns:
            value = row[column]
            if column == "per_position":
                cells.append(_positions(value))
            elif column == "output_tokens_per_s":
                cells.append(fmt(value, 1))
            elif column == "k":
                cells.append(str(int(value)))
            else:
                cells.append(fmt(value))
        rows.append(cells)
    return markdown_table(rows, [SUMMARY_COLUMNS[c] for c in table.columns])


def pivot_markdown(table: pd.DataFrame, value: str, digits: int = 2) -> str | None:
    """``value`` of :func:`summary_table` as a group × k markdown table (groups in order, k ascending);
    ``None`` when no run has the value."""
    if value not in table or table[value].isna().all():
        return None
    wide = table.pivot_table(index="group", columns="k", values=value, aggfunc="first", sort=False, dropna=False)
    wide = wide[sorted(wide.columns)]
    rows = [[str(group), *(fmt(float(v), digits) for v in wide.loc[group])] for group in wide.index]
    return markdown_table(rows, ["group", *(f"k={int(k)}" for k in wide.columns)])


def theory_markdown(fits: pd.DataFrame) -> str:
    """The fitted α and c per group, with the best k by theory and as measured."""
    rows = [[str(f["group"]), fmt(f["alpha"], 3), str(f["alpha_trials"]), fmt(f["c"], 3),
             fmt(f["target_step_ms"]), fmt(f["draft_forward_ms"]), fmt(f["best_k_theory"]),
             fmt(f["best_speedup_theory"]), fmt(f["best_k_measured"]), fmt(f["best_speedup_measured"])]
            for _, f in fits.iterrows()]
    header = ["group", "α", "trials", "c", "target step (ms)", "draft forward (ms)", "best k (theory)",
              "speedup there", "best k (measured)", "speedup there"]
    return markdown_table(rows, header)


def header_section(report: Report) -> str:
    """Title, what was loaded from where, and what was left out."""
    runs = report.runs
    sweeps = sorted(map(str, runs["sweep_group"].dropna().unique()))
    singles = int(runs["sweep_group"].isna().sum())
    ok = int((runs["status"] == "ok").sum())
    what = [f"{len(sweeps)} sweep{'s' * (len(sweeps) != 1)}"] if sweeps else []
    what += [f"{singles} single run{'s' * (singles != 1)}"] if singles else []
    title = sweeps[0] if len(sweeps) == 1 and not singles else " and ".join(what)
    sources = ", ".join(f"`{s}`" for s in report.sources)
    counts = (f"{len(runs)} runs ({ok} ok) in {len(report.groups)} comparison groups, from {sources}; "
              f"device {device_of(runs)}.")
    lines = [f"# Report: {title}", "", counts]
    if report.skipped:
        lines.append(f"{len(report.skipped)} run directories skipped (unusable result.json, listed at the end).")
    lines += ["", SPEEDUP_NOTE]
    return "\n".join(lines)


def groups_section(report: Report) -> str:
    """The legend of the group labels: pair, workload, backend, device, depths and every differing key."""
    rows = [[g["group"], g["pair"], g["workload"], g["backend"], g["device"], g["sweep"], g["k"],
             f"{g['ok']}/{g['runs']}", g["meaning"]] for _, g in report.groups.iterrows()]
    header = ["group", "pair", "workload", "backend", "device", "sweep", "k", "ok/runs", "what differs"]
    return ("## Groups\n\nRuns in one group differ only in k; a label names what tells its group apart from the "
            "others (\"what differs\" spells it out).\n\n" + markdown_table(rows, header))


def _pivot_section(heading: str, value: str) -> Callable[[Report], str | None]:
    def section(report: Report) -> str | None:
        table = pivot_markdown(report.table, value)
        return f"## {heading}\n\n{table}" if table else None

    section.__name__ = f"{value}_section"
    section.__doc__ = f"{heading}: group × k."
    return section


acceptance_section = _pivot_section("Acceptance length by k", "acceptance_length")
speedup_section = _pivot_section("Speedup over k=0 by k", "speedup")


def runs_section(report: Report) -> str | None:
    """One row per finished run."""
    if report.table.empty:
        return None
    return "## Runs\n\n" + summary_markdown(report.table)


def theory_section(report: Report) -> str | None:
    """The theory fit per group."""
    if report.fits.empty:
        return None
    return "## Theory fit\n\n" + theory_markdown(report.fits)


def unfinished_section(report: Report) -> str | None:
    """Runs whose status is not ok, with their error."""
    not_ok = report.runs[report.runs["status"] != "ok"]
    if not_ok.empty:
        return None
    lines = ["## Runs that did not finish", ""]
    lines += [f"- `{r['run_dir']}` ({r[GROUP_LABEL]}): {r['status']} — {r['error']}" for _, r in not_ok.iterrows()]
    return "\n".join(lines)


def skipped_section(report: Report) -> str | None:
    """Run directories whose result.json could not be used, and figures or sections that failed."""
    if not report.skipped and not report.failures:
        return None
    lines = []
    if report.skipped:
        lines += ["## Skipped run directories", ""]
        lines += [f"- `{run_dir}`: {reason}" for run_dir, reason in report.skipped]
    if report.failures:
        lines += ["", "## Not drawn", ""] if lines else ["## Not drawn", ""]
        lines += [f"- {what}: {reason}" for what, reason in report.failures]
    return "\n".join(lines)


def figures_section(report: Report) -> str | None:
    """The figures, in :data:`specexp.analysis.plots.FIGURES` order."""
    if not report.figures:
        return None
    return "## Figures\n\n" + "\n".join(f"![{name}]({path.name})" for name, path in report.figures.items())


def tasks_section(report: Report) -> str | None:
    """Acceptance length, Spec-Bench's mean accepted tokens and speedup per task (or category) × k, when the
    runs recorded per-task results (:mod:`specexp.analysis.tasks`)."""
    from specexp.analysis import tasks

    lines = tasks.report_section(report.runs)
    return "\n".join(lines).rstrip() if lines else None


def dynamic_depth_section(report: Report) -> str | None:
    """Per batch size, the best static k and each dynamic depth mode's tokens/s and ratio to it
    (:mod:`specexp.analysis.depth`), when the runs include a dynamic mode."""
    from specexp.analysis import depth

    table = depth.dynamic_depth_table(report.runs)
    if table.empty:
        return None
    return ("## Dynamic depth\n\nPer batch size (`engine.max_num_seqs`): the static k with the most output tokens/s, "
            "and each dynamic depth mode's tokens/s, the mean k of its steps and its ratio to that best static k.\n\n"
            + depth.dynamic_depth_markdown(table))


SECTIONS: list[Callable[[Report], str | None]] = [
    header_section, groups_section, acceptance_section, speedup_section, dynamic_depth_section, tasks_section,
    runs_section,
    theory_section,
    unfinished_section, figures_section, skipped_section,
]
