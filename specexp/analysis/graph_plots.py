"""The CUDA-graph memory figure: what the captured graphs of each run cost, per manager and per captured
size, readable for one captured size or many, one pair or several.

Per comparison group (one row of panels): graph memory per run as bars stacked by manager vs k, a manager ×
captured-size grid of the deepest run's memory, and capture time stacked by manager vs k. Managers that
exist once per token count (the prompt-prefill graphs ``target_prefill_16``, ``target_prefill_32``, ...)
are one family (``target_prefill_*``) in the stacked bars, so the legend holds at most eight managers plus
"outside the graph records" — the run total's part no captured graph accounts for (the warm-ups'
allocations, :mod:`specexp.engine.cudagraph`). With several groups a first row compares the groups' totals.
"""

from __future__ import annotations

import math
import re

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.gridspec import GridSpec
from matplotlib.patches import Patch

from specexp.analysis.groups import GROUP_KEY
from specexp.analysis.metrics import _ok, graph_capture, has_graph_data
from specexp.analysis.plot_style import (
    MAX_GROUPS_PER_AXES,
    chunks,
    group_colors,
    groups,
    k_axis,
    legend,
    note,
    panel_title,
    subject,
    title_with_legend,
)

MIB = 1024 ** 2
MAX_FAMILIES = 8
OTHER_FAMILY = "other managers"
OUTSIDE = "outside the graph records (warm-up)"
OUTSIDE_COLOR = "#c7c7c7"
TITLE = "CUDA-graph memory and capture time"
# The engine's managers in stacking (and legend) order, target first, each with a colour of its own so a
# manager looks the same in every figure; other families follow with the remaining tab10 colours.
KNOWN_FAMILIES = {"target_verify": "#1f77b4", "target_prefill_*": "#9467bd", "draft_prefill": "#ff7f0e",
                  "draft_decode": "#2ca02c", "draft_prompt_prefill_*": "#8c564b"}
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 5.0, 3.6


def manager_family(manager: str) -> str:
    """The stacked-bar family of a manager: ``target_prefill_128`` -> ``target_prefill_*`` (one manager per
    prompt token count), other names unchanged."""
    match = re.fullmatch(r"(.+)_(\d+)", str(manager))
    return f"{match[1]}_*" if match else str(manager)


def _families(per_size: pd.DataFrame) -> list[str]:
    """Manager families in stacking order: the engine's (:data:`KNOWN_FAMILIES`) first, then the others by
    total memory; past :data:`MAX_FAMILIES` the smallest are merged into :data:`OTHER_FAMILY`."""
    totals = per_size.groupby("family")["capture_bytes"].sum().sort_values(ascending=False, kind="stable")
    names = [f for f in KNOWN_FAMILIES if f in totals.index] + [f for f in totals.index if f not in KNOWN_FAMILIES]
    if len(names) <= MAX_FAMILIES:
        return names
    kept = set(totals.index[:MAX_FAMILIES - 1])
    return [f for f in names if f in kept] + [OTHER_FAMILY]


def _family_colors(families: list[str]) -> dict:
    spare = iter(c for c in plt.get_cmap("tab10").colors if matplotlib.colors.to_hex(c) not in KNOWN_FAMILIES.values())
    colors = {f: KNOWN_FAMILIES.get(f) or next(spare) for f in families}
    return {**colors, OUTSIDE: OUTSIDE_COLOR}


def _per_run(runs: pd.DataFrame, per_size: pd.DataFrame, families: list[str], value: str, total: str) -> pd.DataFrame:
    """One row per run (index run_dir; columns ``k``, ``group_key``, each family and :data:`OUTSIDE`):
    ``value`` summed per family, and the run's ``total`` minus those (never below 0)."""
    values = per_size.assign(**{value: per_size[value].astype(float)})
    wide = values.pivot_table(index="run_dir", columns="family", values=value, aggfunc="sum", fill_value=0.0)
    wide = wide.reindex(columns=families, fill_value=0.0)
    frame = runs.set_index("run_dir")[["k", GROUP_KEY]].join(wide, how="left").fillna({f: 0.0 for f in families})
    totals = pd.to_numeric(runs.set_index("run_dir")[total], errors="coerce") if total in runs else np.nan
    frame[OUTSIDE] = (totals - frame[families].sum(axis=1)).clip(lower=0.0).fillna(0.0)
    return frame


def _stacked(ax, frame: pd.DataFrame, colors: dict, scale: float) -> None:
    """Bars at each k stacked by the columns of ``colors`` (runs of one k averaged), divided by ``scale``."""
    means = frame.groupby("k")[list(colors)].mean().sort_index()
    bottom = np.zeros(len(means))
    for column, color in colors.items():
        heights = means[column].to_numpy() / scale
        if heights.any():
            ax.bar(means.index, heights, bottom=bottom, color=color, width=0.7)
            bottom += heights
    k_axis(ax, means.index)
    ax.grid(alpha=0.3, axis="y")


def _size_grid(fig, ax, rows: pd.DataFrame) -> None:
    """Manager × captured size heat map of one run's graph memory (MiB, summed over key-length buckets)."""
    table = rows.pivot_table(index="manager", columns="size", values="capture_bytes", aggfunc="sum") / MIB
    known = list(KNOWN_FAMILIES)

    def rank(manager: str):
        family = manager_family(manager)
        number = int(manager.rsplit("_", 1)[1]) if family.endswith("_*") else 0
        return (known.index(family) if family in known else len(known), family, number)

    order = sorted(table.index, key=rank)
    table = table.loc[order, sorted(table.columns)]
    values = table.to_numpy(dtype=float)
    image = ax.imshow(values, cmap="Blues", aspect="auto", vmin=0, vmax=max(np.nanmax(values), 1e-9))
    ax.set_xticks(range(len(table.columns)), [str(int(s)) if pd.notna(s) else "?" for s in table.columns])
    ax.set_yticks(range(len(table.index)), table.index, fontsize=7)
    ax.set_xlabel("captured batch size (requests)")
    fontsize = 7 if values.size <= 80 else 5
    threshold = np.nanmax(values) * 0.6
    for (i, j), v in np.ndenumerate(values):
        if not math.isnan(v):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=fontsize,
                    color="white" if v > threshold else "black")
    fig.colorbar(image, ax=ax, label="graph memory (MiB)", pad=0.01)


def graph_memory(df: pd.DataFrame) -> Figure:
    """CUDA-graph memory (MiB) and capture time (s) per run and manager vs k, and per captured size (a
    manager × size grid of each group's deepest run); see the module docstring. Says "no GPU graph data"
    when the runs have none (CPU: graph metrics null)."""
    runs = _ok(df)
    if runs.empty:
        return note(TITLE, "no finished runs")
    if not has_graph_data(runs):
        return note(TITLE, "no GPU graph data: these runs captured no CUDA graphs\n"
                    "(graph metrics are null on CPU; run with engine=cuda)", runs)
    runs = runs[pd.to_numeric(runs["graph_capture_bytes"], errors="coerce").notna()]
    per_size = graph_capture(runs).dropna(subset=["capture_bytes"])
    per_size["family"] = per_size["manager"].map(manager_family)
    families = _families(per_size) if len(per_size) else []
    if OTHER_FAMILY in families:
        kept = set(families)
        per_size.loc[~per_size["family"].isin(kept), "family"] = OTHER_FAMILY
    colors = _family_colors(families)
    memory = _per_run(runs, per_size, families, "capture_bytes", "graph_capture_bytes")
    seconds = _per_run(runs, per_size, families, "capture_s", "graph_capture_s")

    all_groups = list(groups(runs))
    summary = chunks(all_groups, MAX_GROUPS_PER_AXES) if len(all_groups) > 1 else []
    summary_rows = math.ceil(len(summary) / 3)
    nrows = summary_rows + len(all_groups)
    fig = plt.figure(figsize=(PANEL_WIDTH_IN * 3, PANEL_HEIGHT_IN * nrows + 1.1), layout="constrained")
    spec = GridSpec(nrows, 3, figure=fig)
    for i, part in enumerate(summary):
        ax = fig.add_subplot(spec[i // 3, :] if len(summary) == 1 else spec[i // 3, i % 3])
        line_colors = group_colors([label for label, _, _ in part])
        for label, _, group in part:
            totals = group.groupby("k")["graph_capture_bytes"].mean() / MIB
            ax.plot(totals.index, totals.to_numpy(), "o-", color=line_colors[label])
        k_axis(ax, runs["k"])
        ax.set_ylabel("total graph memory (MiB)")
        ax.set_title("total per run, by group", fontsize=10)
        ax.grid(alpha=0.3)
        legend(ax, line_colors)
    for g, (label, key, group) in enumerate(all_groups):
        row = summary_rows + g
        ax_memory, ax_sizes, ax_time = (fig.add_subplot(spec[row, c]) for c in range(3))
        _stacked(ax_memory, memory[memory[GROUP_KEY] == key], colors, MIB)
        ax_memory.set_ylabel("graph memory (MiB)")
        ax_memory.set_title(panel_title(label, "memory by manager", len(all_groups)), fontsize=10)
        _stacked(ax_time, seconds[seconds[GROUP_KEY] == key], colors, 1.0)
        ax_time.set_ylabel("capture time (s)")
        ax_time.set_title(panel_title(label, "capture time by manager", len(all_groups)), fontsize=10)
        deepest = group[group["k"] == group["k"].max()]["run_dir"].iloc[0]
        rows = per_size[per_size["run_dir"] == deepest]
        if rows.empty:
            fig.delaxes(ax_sizes)
        else:
            _size_grid(fig, ax_sizes, rows)
            ax_sizes.set_title(panel_title(label, f"per captured size at k={int(group['k'].max())} (MiB)",
                                          len(all_groups)), fontsize=10)
    handles = [Patch(color=color, label=name) for name, color in colors.items()
               if memory[name].any() or seconds[name].any()]
    title_with_legend(fig, f"{TITLE}\n{subject(runs)}", handles)
    return fig
