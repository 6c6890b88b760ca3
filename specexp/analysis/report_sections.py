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
INTERVALS_NOTE = (
    "Intervals are 95%: acceptance [low, high] from a seeded bootstrap over the run's requests (the resampling "
    "unit); tokens/s and latencies mean ± std over the repeats (n = repeats) with Student's t interval; speedup "
    "[low, high] from the repeats of both points (delta method). A figure marked † was flagged noisy when it was "
    "measured (busy machine, repeats that disagree, a shared GPU, other sweep jobs running beside it; see \"Noise\")."
)
ACCEPTANCE_INTERVALS_NOTE = (
    "Acceptance intervals [low, high] are 95%, from a seeded bootstrap over each run's requests (the resampling "
    "unit); α's over the prompts of its group."
)
ACCEPTANCE_ONLY_NOTE = (
    "Acceptance only: this report leaves out every timing figure (tokens/s, latencies, speedup, c), because "
    "they were measured without repeats or on a machine that was not idle. Acceptance under greedy decoding "
    "does not depend on timing."
)
NOISY_MARK = "†"
SUMMARY_COLUMNS = {
    "group": "group",
    "k": "k",
    "acceptance_length": "acceptance length [95%]",
    "theory_acceptance_length": "theory AL",
    "per_position": "per-position acceptance",
    "output_tokens_per_s": "tokens/s (mean ± std, n)",
    "speedup": "speedup [95%]",
    "theory_speedup": "theory speedup",
    "tpot_ms.p50": "TPOT p50 (ms)",
    "graph_memory_mib": "graph memory (MiB)",
}
TIMING_COLUMNS = ("output_tokens_per_s", "speedup", "theory_speedup", "tpot_ms.p50")
# Columns summary_table carries besides the shown ones (they are in summary.csv), to format the cells.
INTERVAL_COLUMNS = {
    "acceptance_low": "intervals.acceptance.acceptance_length.low",
    "acceptance_high": "intervals.acceptance.acceptance_length.high",
    "num_requests": "num_requests",
    "output_tokens_per_s_std": "intervals.output_tokens_per_s.std",
    "output_tokens_per_s_low": "intervals.output_tokens_per_s.low",
    "output_tokens_per_s_high": "intervals.output_tokens_per_s.high",
    "num_repeats": "num_repeats",
}


@dataclass
class Report:
    """What the sections read: ``runs`` (every loaded run, with group columns), ``table``
    (:func:`summary_table`), ``fits`` (:func:`specexp.analysis.theory.fit_theory`), ``groups``
    (:func:`specexp.analysis.groups.group_table`), ``sources`` (the paths given), ``skipped`` ((run_dir,
    reason) of unusable records), ``figures`` (name -> PNG path), ``failures`` ((what, one-line reason)
    of figures or sections that could not be made) and ``acceptance_only`` (no timing figures)."""

    runs: pd.DataFrame
    table: pd.DataFrame
    fits: pd.DataFrame
    groups: pd.DataFrame
    sources: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)
    acceptance_only: bool = False  # leave out every timing figure (report --acceptance-only)


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


def _noisy(runs: pd.DataFrame, figure: str) -> list[bool]:
    """Per run, whether its record marks ``figure`` noisy (:func:`specexp.measure.guards.is_marked`)."""
    from specexp.measure.guards import is_marked

    marked = runs["noise.figures"] if "noise.figures" in runs else pd.Series([None] * len(runs), index=runs.index)
    return [is_marked({"figures": list(m) if isinstance(m, (list, tuple)) or hasattr(m, "tolist") else []}, figure)
            for m in marked]


def summary_table(df: pd.DataFrame, acceptance_only: bool = False) -> pd.DataFrame:
    """One row per finished run with the columns of :data:`SUMMARY_COLUMNS` (numbers, unformatted) and
    those of :data:`INTERVAL_COLUMNS` plus ``speedup_low``/``speedup_high`` and ``noisy`` (the record marks its
    throughput noisy), sorted by group (in first-appearance order) and k. ``acceptance_only``: no timing
    columns."""
    runs = with_theory(df)
    shown = [c for c in SUMMARY_COLUMNS if not (acceptance_only and c in TIMING_COLUMNS)]
    if runs.empty:
        return pd.DataFrame(columns=shown)
    runs["per_position"] = runs.get("per_position_acceptance")
    runs["graph_memory_mib"] = _column(runs, "graph_capture_bytes") / MIB
    for name, source in INTERVAL_COLUMNS.items():
        runs[name] = _column(runs, source)
    runs["noisy"] = _noisy(runs, "output_tokens_per_s")
    order = {key: i for i, key in enumerate(dict.fromkeys(runs[GROUP_KEY]))}
    runs = runs.assign(_order=runs[GROUP_KEY].map(order)).sort_values(["_order", "k"], kind="stable")
    extra = [*INTERVAL_COLUMNS, "speedup_low", "speedup_high", "noisy"]
    if acceptance_only:
        extra = ["acceptance_low", "acceptance_high", "num_requests"]
    return runs[[c for c in [*shown, *extra] if c in runs]].reset_index(drop=True)


def bounds(low, high, digits: int = 2) -> str:
    """``[low, high]``, or "" when the interval is unknown."""
    if low is None or high is None or any(isinstance(v, float) and math.isnan(v) for v in (low, high)):
        return ""
    return f" [{low:.{digits}f}, {high:.{digits}f}]"


def spread(mean, std, n, digits: int = 1) -> str:
    """``188.7 ± 3.2 (n=3)``; ``188.7 (n=1)`` without a spread."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    count = "" if n is None or (isinstance(n, float) and math.isnan(n)) else f" (n={int(n)})"
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.{digits}f}{count}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}{count}"


def table_cell(row, column: str) -> str:
    """One :func:`summary_table` cell with its interval (acceptance, speedup), spread (tokens/s) and mark."""
    value = row[column]
    if column == "per_position":
        return _positions(value)
    if column == "k":
        return str(int(value))
    if column == "acceptance_length":
        return fmt(value) + bounds(row.get("acceptance_low"), row.get("acceptance_high"))
    mark = NOISY_MARK if column in TIMING_COLUMNS and bool(row.get("noisy")) else ""
    if column == "output_tokens_per_s":
        return spread(value, row.get("output_tokens_per_s_std"), row.get("num_repeats")) + mark
    if column == "speedup":
        return fmt(value) + bounds(row.get("speedup_low"), row.get("speedup_high")) + mark
    return fmt(value) + mark


def summary_markdown(table: pd.DataFrame) -> str:
    """:func:`summary_table` as markdown ("–" for values not measured, e.g. graph memory on CPU); the
    interval columns go into the shown cells."""
    shown = [c for c in table.columns if c in SUMMARY_COLUMNS]
    rows = [[table_cell(row, column) for column in shown] for _, row in table.iterrows()]
    return markdown_table(rows, [SUMMARY_COLUMNS[c] for c in shown])


def pivot_markdown(table: pd.DataFrame, value: str, digits: int = 2) -> str | None:
    """``value`` of :func:`summary_table` as a group × k markdown table (groups in order, k ascending), each
    cell with its interval where the table has one (:func:`table_cell`); ``None`` when no run has the value."""
    if value not in table or table[value].isna().all():
        return None
    cells = table.assign(_cell=[table_cell(row, value) if pd.notna(row[value]) else "–" for _, row in table.iterrows()])
    wide = cells.pivot_table(index="group", columns="k", values="_cell", aggfunc="first", sort=False, dropna=False)
    wide = wide[sorted(wide.columns)]
    rows = [[str(group), *(v if isinstance(v, str) else "–" for v in wide.loc[group])] for group in wide.index]
    return markdown_table(rows, ["group", *(f"k={int(k)}" for k in wide.columns)])


def theory_markdown(fits: pd.DataFrame, acceptance_only: bool = False) -> str:
    """The fitted α (bootstrap interval over requests) and c (interval over repeats) per group, with the best
    k by theory (and its range over the intervals) and as measured (and whether the next-best k is inside its
    interval). ``acceptance_only``: α alone."""
    from specexp.analysis.theory_intervals import best_k_claim

    def alpha(f) -> str:
        note = " (approx.)" if f.get("alpha_interval") == "approximate" else ""
        return fmt(f["alpha"], 3) + bounds(f.get("alpha_low"), f.get("alpha_high"), 3) + note

    if acceptance_only:
        rows = [[str(f["group"]), alpha(f), str(f["alpha_trials"]), fmt(f.get("alpha_requests"))]
                for _, f in fits.iterrows()]
        return markdown_table(rows, ["group", "α [95%]", "trials", "requests"])
    rows = [[str(f["group"]), alpha(f), str(f["alpha_trials"]), fmt(f["c"], 3) + bounds(f.get("c_low"), f.get("c_high"), 3),
             fmt(f["target_step_ms"]), fmt(f["draft_forward_ms"]), fmt(f["best_k_theory"]),
             str(f.get("best_k_theory_range", "–")), fmt(f["best_speedup_theory"]), best_k_claim(f)]
            for _, f in fits.iterrows()]
    header = ["group", "α [95%]", "trials", "c [95%]", "target step (ms)", "draft forward (ms)", "best k (theory)",
              "over the intervals", "speedup there", "best k (measured)"]
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
    if report.acceptance_only:
        lines += ["", ACCEPTANCE_ONLY_NOTE, "", ACCEPTANCE_INTERVALS_NOTE]
    else:
        lines += ["", SPEEDUP_NOTE, "", INTERVALS_NOTE, "", measurement_line(runs)]
    return "\n".join(lines)


def measurement_line(runs: pd.DataFrame) -> str:
    """How the runs were measured: repeats per run, in what order, warm-up requests."""
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    repeats = sorted({int(v) for v in _column(ok, "num_repeats").dropna()})
    orders = sorted({str(v) for v in ok.get("measurement.order", pd.Series(dtype=object)).dropna()})
    warmups = sorted({int(v) for v in _column(ok, "measurement.warmup_requests").dropna()})
    text = f"Measured with {', '.join(map(str, repeats)) or '1'} repeat(s) per run"
    text += f" ({', '.join(o.replace('_', ' ') for o in orders)})" if orders else " (recorded before repeats existed)"
    if warmups:
        text += f", {', '.join(map(str, warmups))} warm-up request(s) each"
    return text + "."


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


acceptance_section = _pivot_section("Acceptance length by k [95% bootstrap over requests]", "acceptance_length")
_speedup_pivot = _pivot_section("Speedup over k=0 by k [95% from the repeats]", "speedup")


def speedup_section(report: Report) -> str | None:
    """Speedup over k=0: group × k, with intervals (left out of an acceptance-only report)."""
    return None if report.acceptance_only else _speedup_pivot(report)


def runs_section(report: Report) -> str | None:
    """One row per finished run."""
    if report.table.empty:
        return None
    return "## Runs\n\n" + summary_markdown(report.table)


def theory_section(report: Report) -> str | None:
    """The theory fit per group."""
    if report.fits.empty:
        return None
    return "## Theory fit\n\n" + theory_markdown(report.fits, report.acceptance_only)


def noise_section(report: Report) -> str | None:
    """Runs whose record flags its timings noisy, with the warning each printed when it ran."""
    if report.acceptance_only or "noise.warnings" not in report.runs:
        return None
    lines = []
    for _, run in report.runs.iterrows():
        warnings = run["noise.warnings"]
        warnings = list(warnings) if isinstance(warnings, (list, tuple)) or hasattr(warnings, "tolist") else []
        lines += [f"- {NOISY_MARK} `{run['run_dir']}` ({run[GROUP_LABEL]}, k={run['k']}): {w}" for w in warnings]
    if not lines:
        return None
    return "## Noise\n\nTimings these runs flagged when they were measured (marked " + NOISY_MARK + " above):\n\n" + \
        "\n".join(lines)


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

    lines = tasks.report_section(report.runs, acceptance_only=report.acceptance_only)
    return "\n".join(lines).rstrip() if lines else None


def dynamic_depth_section(report: Report) -> str | None:
    """Per batch size, the best static k and each dynamic depth mode's tokens/s and ratio to it, when the runs
    include a dynamic mode; and, where static runs cover several batch sizes, the schedule of each size's best k
    (:mod:`specexp.analysis.depth`)."""
    from specexp.analysis import depth

    if report.acceptance_only:
        return None
    runs = depth.with_depth_modes(report.runs)  # annotated once: both readers take it as it is
    table = depth.dynamic_depth_table(runs)
    suggestions = depth.suggested_schedules(runs)
    if table.empty and not suggestions:
        return None
    parts = ["## Dynamic depth"]
    if not table.empty:
        parts += [("Per batch size (`engine.max_num_seqs`): the static k with the most output tokens/s, and each "
                   "dynamic depth mode's tokens/s, the mean k of its steps and its ratio to that best static k."),
                  depth.dynamic_depth_markdown(table)]
    if suggestions:
        parts += [("A batch-size schedule that runs each measured batch size at its best static k (the tail past "
                   "the largest size keeps its k). The best k of a size is read from these runs' means, so measure "
                   "the schedule against it before relying on it:"), depth.suggested_schedules_markdown(suggestions)]
    return "\n\n".join(parts)


SECTIONS: list[Callable[[Report], str | None]] = [
    header_section, groups_section, acceptance_section, speedup_section, dynamic_depth_section, tasks_section,
    runs_section, theory_section, noise_section,
    unfinished_section, figures_section, skipped_section,
]
