"""Per-task and per-category results: Spec-Bench's leaderboard layout (task × depth) from
``metrics.by_task`` / ``metrics.by_category`` of the runs (:mod:`specexp.group_metrics`).

    from specexp.analysis import tasks
    table = tasks.per_task(runs)                          # one row per (run, task)
    tasks.task_pivot(runs, "acceptance_length")           # rows (group, task), columns k
    tasks.task_pivot(runs, "speedup")
    tasks.acceptance_by_task(runs)                        # a matplotlib Figure

``speedup`` of a task at depth k = the task's ``output_tokens_per_s`` ÷ the same task's at k = 0 in the same
comparison group (:mod:`specexp.analysis.groups`); a group's figure is its output tokens over its requests'
summed end-to-end times, so with ``workload.one_at_a_time`` it is the task's own throughput.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specexp.analysis.groups import GROUP_KEY, GROUP_LABEL, with_groups

LEVELS = {"task": "by_task", "category": "by_category"}
RUN_COLUMNS = ("run_dir", GROUP_KEY, GROUP_LABEL, "sweep_group", "k")
VALUE_COLUMNS = ("num_requests", "num_output_tokens", "acceptance_length", "draft_acceptance_rate",
                 "spec_bench_mean_accepted_tokens", "output_tokens_per_s", "ttft_ms.p50", "tpot_ms.p50")
FIGURE_FILE = "acceptance_by_task.png"


def _groups_of(run: pd.Series, level: str) -> dict:
    groups = run.get(LEVELS[level])
    return groups if isinstance(groups, dict) else {}


def per_task(df: pd.DataFrame, level: str = "task") -> pd.DataFrame:
    """One row per (finished run, task) — or per category with ``level="category"`` — with the run's ids,
    ``task``, :data:`VALUE_COLUMNS` and ``speedup``. Empty when no run recorded groups of that level."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: choose one of {', '.join(LEVELS)}")
    runs = with_groups(df) if GROUP_KEY not in df else df
    if "status" in runs:
        runs = runs[runs["status"] == "ok"]
    rows = []
    for _, run in runs.iterrows():
        for name, group in _groups_of(run, level).items():
            row = {c: run.get(c) for c in RUN_COLUMNS}
            row["task"] = name
            for column in VALUE_COLUMNS:
                key, _, stat = column.partition(".")
                value = group.get(key)
                row[column] = (value or {}).get(stat) if stat else value
            rows.append(row)
    table = pd.DataFrame(rows, columns=[*RUN_COLUMNS, "task", *VALUE_COLUMNS, "speedup"])
    if table.empty:
        return table
    speed = pd.to_numeric(table["output_tokens_per_s"], errors="coerce")
    baseline = speed[table["k"] == 0].groupby([table[GROUP_KEY], table["task"]]).mean()
    keys = list(zip(table[GROUP_KEY], table["task"], strict=True))
    table["speedup"] = speed / pd.Series([baseline.get(key, math.nan) for key in keys], index=table.index)
    return table


def task_pivot(df: pd.DataFrame, value: str = "acceptance_length", level: str = "task") -> pd.DataFrame:
    """``value`` of :func:`per_task` with rows (group, task) in first-seen order and one column per k."""
    table = per_task(df, level)
    if table.empty:
        return pd.DataFrame()
    wide = table.pivot_table(index=[GROUP_LABEL, "task"], columns="k", values=value, aggfunc="mean", sort=False)
    wide.columns = [f"k={int(k)}" for k in wide.columns]
    return wide[sorted(wide.columns, key=lambda c: int(c[2:]))]


def _markdown(wide: pd.DataFrame, digits: int = 2) -> str:
    groups = wide.index.get_level_values(0)
    show_group = len(set(groups)) > 1
    header = ["group"] * show_group + ["task", *wide.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (group, task), values in wide.iterrows():
        cells = ["–" if pd.isna(v) else f"{v:.{digits}f}" for v in values]
        lines.append("| " + " | ".join([str(group)] * show_group + [str(task), *cells]) + " |")
    return "\n".join(lines)


def report_level(df: pd.DataFrame) -> str | None:
    """``task`` when runs recorded Spec-Bench tasks, else ``category`` when some run has several categories,
    else ``None`` (nothing per group worth a section)."""
    runs = df[df["status"] == "ok"] if "status" in df else df
    if any(_groups_of(run, "task") for _, run in runs.iterrows()):
        return "task"
    if any(len(_groups_of(run, "category")) > 1 for _, run in runs.iterrows()):
        return "category"
    return None


def report_section(df: pd.DataFrame, out: str | Path | None = None, acceptance_only: bool = False) -> list[str]:
    """Markdown lines of the report's per-task section (acceptance length, Spec-Bench's mean accepted
    tokens and speedup, each task × k; no speedup when ``acceptance_only``), and its figure written to ``out``
    when given; [] when there are no per-task results. Per-task figures are those of each run's first repeat
    (``metrics.by_task``): they carry no interval."""
    level = report_level(df)
    if level is None:
        return []
    lines = [f"## Per {level}", "",
             (f"Each {level}'s requests only (`metrics.by_{level}`). Speedup = the {level}'s tokens/s ÷ its"
              " tokens/s at k=0 in the same group (tokens over the requests' summed end-to-end time; with"
              " `workload.one_at_a_time` the task's own throughput). These figures come from each run's first"
              " repeat and carry no interval."), ""]
    tables = [("Acceptance length", "acceptance_length"),
              ("Spec-Bench mean accepted tokens (every step, prefill included)", "spec_bench_mean_accepted_tokens")]
    if not acceptance_only:
        tables.append(("Speedup over k=0 (first repeat, no interval)", "speedup"))
    for title, value in tables:
        lines += [f"### {title} by {level} and k", "", _markdown(task_pivot(df, value, level)), ""]
    if out is not None:
        import matplotlib.pyplot as plt

        fig = acceptance_by_task(df, level)
        fig.savefig(Path(out) / FIGURE_FILE, dpi=110)
        plt.close(fig)
        lines += [f"![acceptance by {level}]({FIGURE_FILE})", ""]
    return lines


def acceptance_by_task(df: pd.DataFrame, level: str = "task"):
    """Acceptance length vs k, one line per task, one panel per comparison group (a matplotlib Figure)."""
    import matplotlib.pyplot as plt

    table = per_task(df, level)
    if table.empty:
        fig, ax = plt.subplots(figsize=(6, 2.5))
        ax.axis("off")
        ax.text(0.5, 0.5, f"no per-{level} results in these runs", ha="center", va="center", transform=ax.transAxes)
        return fig
    groups = list(dict.fromkeys(table[GROUP_LABEL]))
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 3.8), squeeze=False)
    for ax, group in zip(axes[0], groups, strict=True):
        rows = table[table[GROUP_LABEL] == group]
        for task, curve in rows.groupby("task", sort=False):
            curve = curve.sort_values("k")
            ax.plot(curve["k"], pd.to_numeric(curve["acceptance_length"], errors="coerce"), marker="o", label=task)
        ax.set(title=str(group), xlabel="k (draft tokens per step)", ylabel="acceptance length (tokens/step)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title=level)
    fig.tight_layout()
    return fig
