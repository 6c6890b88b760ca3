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

**Intervals.** A run measured with several repeats keeps each task's tokens/s of every repeat
(``repeats.by_task``, :mod:`specexp.measure.summary`). A task's ``output_tokens_per_s`` is then the mean over
the repeats, ``output_tokens_per_s_std`` their standard deviation, and its speedup the ratio of that mean to
the k = 0 mean (the k = 0 repeats of the task pooled over the group's k = 0 runs) with the 95% interval the
run's speedup gets (:func:`specexp.measure.intervals.ratio_interval`: delta method on the log ratio, Welch's
degrees of freedom): ``speedup_low`` / ``speedup_high``, from ``speedup_repeats`` repeats at k and
``baseline_repeats`` at k = 0. Bounds are NaN at k = 0 (the reference) and with one repeat on either side
(records from before repeats kept per-task figures read as one repeat: the first).
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


INTERVAL_COLUMNS = ("output_tokens_per_s_std", "output_tokens_per_s_repeats", "speedup", "speedup_low",
                    "speedup_high", "speedup_repeats", "baseline_repeats", "noisy")


def _present(values) -> list[float]:
    out = []
    for v in values if isinstance(values, (list, tuple)) or hasattr(values, "tolist") else []:
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if not math.isnan(v):
            out.append(v)
    return out


def task_repeats(run: pd.Series, level: str, task: str, figure: str = "output_tokens_per_s") -> list[float]:
    """The per-repeat values of ``figure`` for one task of a run (``repeats.by_<level>``); the task's one
    recorded value (``metrics.by_<level>``, the first repeat's) where the run kept no per-repeat figures."""
    kept = run.get(f"repeats.{LEVELS[level]}")
    values = _present(((kept or {}).get(task) or {}).get(figure)) if isinstance(kept, dict) else []
    if values:
        return values
    key, _, stat = figure.partition(".")
    value = _groups_of(run, level).get(task, {}).get(key)
    return _present([(value or {}).get(stat) if stat else value])


def _with_intervals(table: pd.DataFrame, repeats: list[list[float]]) -> pd.DataFrame:
    """``table`` (rows of :func:`per_task`) with :data:`INTERVAL_COLUMNS`; ``repeats[i]``: row i's tokens/s
    per repeat."""
    from specexp.measure.intervals import ratio_interval, repeat_summary

    summaries = [repeat_summary(values) for values in repeats]
    recorded = pd.to_numeric(table["output_tokens_per_s"], errors="coerce")
    means = pd.Series([s["mean"] if s["mean"] is not None else math.nan for s in summaries], index=table.index)
    table["output_tokens_per_s"] = means.where(means.notna(), recorded)
    table["output_tokens_per_s_std"] = [s["std"] if s["std"] is not None else math.nan for s in summaries]
    table["output_tokens_per_s_repeats"] = [s["n"] for s in summaries]
    keys = list(zip(table[GROUP_KEY], table["task"], strict=True))
    baselines: dict = {}
    for key, values, k in zip(keys, repeats, table["k"], strict=True):
        if k == 0:
            baselines.setdefault(key, []).extend(values)
    columns = {name: [] for name in ("speedup", "speedup_low", "speedup_high", "baseline_repeats")}
    for key, values, k in zip(keys, repeats, table["k"], strict=True):
        base = baselines.get(key, [])
        ratio = ratio_interval(values, base) if base else {}
        value = ratio.get("value")
        columns["speedup"].append(1.0 if k == 0 and values else value if value is not None else math.nan)
        for side in ("low", "high"):
            bound = ratio.get(side) if k != 0 else None
            columns[f"speedup_{side}"].append(bound if bound is not None else math.nan)
        columns["baseline_repeats"].append(len(base))
    for name, values in columns.items():
        table[name] = values
    table["speedup_repeats"] = table["output_tokens_per_s_repeats"]
    return table


def per_task(df: pd.DataFrame, level: str = "task") -> pd.DataFrame:
    """One row per (finished run, task) — or per category with ``level="category"`` — with the run's ids,
    ``task``, :data:`VALUE_COLUMNS` and :data:`INTERVAL_COLUMNS` (the module docstring's "Intervals";
    ``noisy``: the run's record marks its throughput noisy). Empty when no run recorded groups of that
    level."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: choose one of {', '.join(LEVELS)}")
    from specexp.measure.guards import is_marked

    runs = with_groups(df) if GROUP_KEY not in df else df
    if "status" in runs:
        runs = runs[runs["status"] == "ok"]
    rows, repeats = [], []
    for _, run in runs.iterrows():
        marked = run.get("noise.figures")
        noisy = is_marked({"figures": list(marked) if isinstance(marked, (list, tuple)) or hasattr(marked, "tolist")
                           else []}, "output_tokens_per_s")
        for name, group in _groups_of(run, level).items():
            row = {c: run.get(c) for c in RUN_COLUMNS}
            row["task"] = name
            for column in VALUE_COLUMNS:
                key, _, stat = column.partition(".")
                value = group.get(key)
                row[column] = (value or {}).get(stat) if stat else value
            row["noisy"] = noisy
            rows.append(row)
            repeats.append(task_repeats(run, level, name))
    table = pd.DataFrame(rows, columns=[*RUN_COLUMNS, "task", *VALUE_COLUMNS, *INTERVAL_COLUMNS])
    if table.empty:
        return table
    return _with_intervals(table, repeats)


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


NOISY_MARK = "†"


def _speedup_cell(row: pd.Series, show_n: bool) -> str:
    """``1.50 [1.32, 1.70]`` (``†`` when the run's timings were flagged noisy, ``n=3/3`` when asked)."""
    value = row["speedup"]
    if pd.isna(value):
        return "–"
    text = f"{value:.2f}"
    if pd.notna(row["speedup_low"]) and pd.notna(row["speedup_high"]):
        text += f" [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"
    if show_n:
        text += f" n={int(row['speedup_repeats'])}/{int(row['baseline_repeats'])}"
    return text + (NOISY_MARK if bool(row["noisy"]) else "")


def repeat_counts(table: pd.DataFrame) -> str:
    """How many repeats the speedups of :func:`per_task` rest on: ``n = 3 repeats at each k and 3 at k=0``
    when every point has as many, else ``n = repeats at k / at k=0 in each cell``."""
    spec = table[table["k"] != 0]
    at_k, at_0 = set(spec["speedup_repeats"]), set(spec["baseline_repeats"])
    if len(at_k) == 1 and len(at_0) == 1:
        (n_k,), (n_0,) = at_k, at_0
        return f"n = {n_k} repeat{'s' * (n_k != 1)} at each k and {n_0} at k=0"
    return "n = repeats at k / at k=0 in each cell"


def speedup_markdown(df: pd.DataFrame, level: str = "task") -> str:
    """The speedup of :func:`per_task` as a (group, task) × k markdown table, each cell with its 95% interval
    (and its repeat counts when they differ between cells, :func:`repeat_counts`)."""
    table = per_task(df, level)
    show_n = repeat_counts(table).startswith("n = repeats")
    cells = table.assign(_cell=[_speedup_cell(row, show_n) for _, row in table.iterrows()])
    wide = cells.pivot_table(index=[GROUP_LABEL, "task"], columns="k", values="_cell", aggfunc="first", sort=False)
    wide = wide[sorted(wide.columns)]
    groups = wide.index.get_level_values(0)
    show_group = len(set(groups)) > 1
    header = ["group"] * show_group + ["task", *(f"k={int(k)}" for k in wide.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (group, task), values in wide.iterrows():
        row = [v if isinstance(v, str) else "–" for v in values]
        lines.append("| " + " | ".join([str(group)] * show_group + [str(task), *row]) + " |")
    return "\n".join(lines)


def report_section(df: pd.DataFrame, out: str | Path | None = None, acceptance_only: bool = False) -> list[str]:
    """Markdown lines of the report's per-task section (acceptance length, Spec-Bench's mean accepted
    tokens and speedup with its 95% interval from the repeats of both points, each task × k; no speedup when
    ``acceptance_only``), and its figure written to ``out`` when given; [] when there are no per-task results.
    Per-task acceptance figures are those of each run's first repeat (``metrics.by_task``; under greedy
    decoding every repeat accepts the same)."""
    level = report_level(df)
    if level is None:
        return []
    intro = f"Each {level}'s requests only (`metrics.by_{level}`)."
    if not acceptance_only:
        intro += (f" Speedup = the {level}'s mean tokens/s over the repeats ÷ its mean at k=0 in the same group"
                  " (tokens over the requests' summed end-to-end time; with `workload.one_at_a_time` the task's own"
                  " throughput).")
    lines = [f"## Per {level}", "", intro, ""]
    tables = [("Acceptance length", "acceptance_length"),
              ("Spec-Bench mean accepted tokens (every step, prefill included)", "spec_bench_mean_accepted_tokens")]
    for title, value in tables:
        lines += [f"### {title} by {level} and k", "", _markdown(task_pivot(df, value, level)), ""]
    if not acceptance_only:
        counts = repeat_counts(per_task(df, level))
        lines += [f"### Speedup over k=0 by {level} and k [95% from the repeats of both points]", "",
                  (f"{counts}. The interval is the delta method on the log ratio of the two means with Welch's"
                   " degrees of freedom (`specexp.measure.intervals.ratio_interval`); none with one repeat on"
                   f" either side. {NOISY_MARK}: the run's timings were flagged noisy when measured."), "",
                  speedup_markdown(df, level), ""]
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
