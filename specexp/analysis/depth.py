"""Dynamic speculation depth in analysis: which depth mode a run used, and, per batch size, how each dynamic mode
compares with the best static k (``+exp=dynamic_depth``; the report's "Dynamic depth" section and figure).

A run's *depth mode* (:func:`depth_mode`) is ``static`` (one k every step), ``schedule``
(``speculator.num_speculative_tokens_per_batch_size``), ``confidence`` (``speculator.draft_confidence_threshold``
> 0) or ``goodput`` (``speculator.adaptive=goodput``). Runs are compared within a *depth group*: the same sweep and
the same config except k, the depth settings and ``engine.max_num_seqs`` (the batch size, a row of the table).
:func:`dynamic_depth_table` gives per (depth group, batch size) the static k with the most output tokens/s, its
tokens/s, and each dynamic mode's tokens/s, mean k (from ``num_speculative_tokens_hist``) and ratio to that best.
"""

from __future__ import annotations

import math

import pandas as pd

from specexp.analysis.groups import _hashable, comparison_columns

DEPTH_KEYS = ("speculator.num_speculative_tokens_per_batch_size", "speculator.draft_confidence_threshold",
              "speculator.adaptive", "speculator.cudagraph_num_speculative_tokens")
BATCH_COLUMN = "engine.max_num_seqs"
DYNAMIC_MODES = ("schedule", "confidence", "goodput")
TOKENS = "output_tokens_per_s"
TOKENS_STD = "intervals.output_tokens_per_s.std"  # over the run's repeats (specexp.measure)


def _present(value) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return not (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)


def depth_mode(run: pd.Series | dict) -> str:
    """``static``, ``schedule``, ``confidence`` or ``goodput`` (see the module docstring)."""
    get = run.get
    if _present(get("speculator.num_speculative_tokens_per_batch_size")):
        return "schedule"
    if _present(get("speculator.draft_confidence_threshold")):
        return "confidence"
    if get("speculator.adaptive") not in (None, "off") and _present(get("speculator.adaptive")):
        return "goodput"
    return "static"


def mean_depth(hist) -> float | None:
    """The mean k of a run's steps from ``num_speculative_tokens_hist`` (None without one)."""
    if not isinstance(hist, (list, tuple)) or not sum(hist):
        return None
    return sum(k * n for k, n in enumerate(hist)) / sum(hist)


DEPTH_COLUMNS = frozenset({"depth_mode", "mean_k", "depth_group"})  # what with_depth_modes adds


def with_depth_modes(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (ok runs only) with ``depth_mode``, ``mean_k`` and ``depth_group`` (the group key) columns; a frame
    that already has them (this function's output) is returned as it is."""
    if DEPTH_COLUMNS <= set(runs.columns):
        return runs
    ok = runs[runs["status"] == "ok"].copy() if "status" in runs else runs.copy()
    if ok.empty:
        return ok.assign(depth_mode=[], mean_k=[], depth_group=[])
    ok["depth_mode"] = [depth_mode(row) for _, row in ok.iterrows()]
    hist = ok["num_speculative_tokens_hist"] if "num_speculative_tokens_hist" in ok else [None] * len(ok)
    ok["mean_k"] = [mean_depth(h) for h in hist]
    keys = [c for c in comparison_columns(ok) if c in ok and c not in DEPTH_KEYS and c != BATCH_COLUMN]
    ok["depth_group"] = ok[keys].map(_hashable).astype(str).agg("|".join, axis=1) if keys else ""
    return ok


def has_dynamic_runs(runs: pd.DataFrame) -> bool:
    """Whether any ok run used a dynamic depth mode."""
    return bool((with_depth_modes(runs)["depth_mode"] != "static").any()) if len(runs) else False


def _label(cell: pd.DataFrame) -> str:
    """A depth group's label: its pair and workload, and its sweep when there is one."""
    first = cell.iloc[0]
    parts = [first.get(c) for c in ("pair.name", "workload.name", "sweep_group")]
    return " · ".join(str(p) for p in parts if _present(p) and isinstance(p, str)) or "runs"


def _spread_of(run, name: str) -> dict:
    """``{name_std, name_n}``: a run's tokens/s std over its repeats and their count (None where unrecorded)."""
    if run is None:
        return {f"{name}_std": None, f"{name}_n": None}
    def known(value):
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else value

    return {f"{name}_std": known(run.get(TOKENS_STD)), f"{name}_n": known(run.get("num_repeats"))}


def dynamic_depth_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (depth group, batch size) with a dynamic run: ``group`` (pair · workload · sweep),
    ``batch_size``, ``best_static_k``, ``best_static_tokens_per_s`` and per dynamic mode
    ``<mode>_tokens_per_s``, ``<mode>_mean_k`` and ``<mode>_ratio`` (÷ the best static; None without a static
    run); each tokens/s with its std over repeats (``..._std``) and repeat count (``..._n``). Groups in
    first-appearance order, batch sizes ascending."""
    runs = with_depth_modes(runs)
    rows = []
    if runs.empty or TOKENS not in runs:
        return pd.DataFrame(rows)
    batch = runs[BATCH_COLUMN] if BATCH_COLUMN in runs else pd.Series([None] * len(runs), index=runs.index)
    for (group, size), cell in runs.groupby([runs["depth_group"], batch], sort=False, dropna=False):
        dynamic = cell[cell["depth_mode"] != "static"]
        if dynamic.empty:
            continue
        static = cell[(cell["depth_mode"] == "static") & cell[TOKENS].notna()]
        best = static.loc[static[TOKENS].idxmax()] if len(static) else None
        best_tps = float(best[TOKENS]) if best is not None else None
        row = {"group": _label(cell), "batch_size": size,
               "best_static_k": int(best["k"]) if best is not None else None, "best_static_tokens_per_s": best_tps,
               **_spread_of(best, "best_static_tokens_per_s")}
        for mode in DYNAMIC_MODES:
            runs_of_mode = dynamic[dynamic["depth_mode"] == mode]
            if runs_of_mode.empty:
                continue
            run = runs_of_mode.iloc[0]
            tps = run[TOKENS]
            row[f"{mode}_tokens_per_s"] = tps
            row.update(_spread_of(run, f"{mode}_tokens_per_s"))
            row[f"{mode}_mean_k"] = run["mean_k"]
            row[f"{mode}_ratio"] = tps / best_tps if best_tps and pd.notna(tps) else None
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty:
        order = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
        table = table.assign(_o=table["group"].map(order)).sort_values(["_o", "batch_size"], kind="stable")
        table = table.drop(columns="_o").reset_index(drop=True)
    return table


def suggested_schedules(runs: pd.DataFrame) -> list[dict]:
    """Per depth group whose static runs cover two or more batch sizes: the batch-size schedule of each size's best
    static k (most output tokens/s, averaged over that k's runs), as ``{"group", "best_k": {batch size: k}, "schedule": [[start_bs, end_bs, k],
    ...], "overrides": "speculator.num_speculative_tokens=K speculator.num_speculative_tokens_per_batch_size=[...]"}``
    (K = the largest k of the schedule; `specexp.engine.depth.schedule_from_best_k`), or, where one k is best at
    every size, ``"speculator.num_speculative_tokens=k"`` alone. Groups in first-appearance order."""
    from specexp.engine.depth import SCHEDULE_KEY, schedule_from_best_k

    runs = with_depth_modes(runs)
    if runs.empty or TOKENS not in runs or BATCH_COLUMN not in runs:
        return []
    static = runs[(runs["depth_mode"] == "static") & runs[TOKENS].notna() & runs[BATCH_COLUMN].notna()]
    out = []
    for _, cell in static.groupby("depth_group", sort=False):
        best_k = {int(size): int(part.groupby("k")[TOKENS].mean().idxmax())  # runs of one k (seeds): their mean
                  for size, part in cell.groupby(BATCH_COLUMN)}
        if len(best_k) < 2:
            continue
        schedule = [list(r) for r in schedule_from_best_k(best_k)]
        if len(schedule) == 1:  # one k everywhere: that static k is the schedule
            overrides = f"speculator.num_speculative_tokens={schedule[0][2]}"
        else:
            max_k = max(k for _, _, k in schedule)
            compact = str(schedule).replace(" ", "")  # one shell word
            overrides = f"speculator.num_speculative_tokens={max_k} {SCHEDULE_KEY}={compact}"
        out.append({"group": _label(cell), "best_k": best_k, "schedule": schedule, "overrides": overrides})
    return out


def suggested_schedules_markdown(suggestions: list[dict]) -> str:
    """One bullet per group: its best static k by batch size and the overrides that run that schedule."""
    lines = []
    for s in suggestions:
        by_size = ", ".join(f"{b}: k={k}" for b, k in sorted(s["best_k"].items()))
        what = "one k at every batch size, a static k" if len(s["schedule"]) == 1 else "the schedule"
        lines.append(f"- {s['group']} (best static k by batch size {by_size}; {what}): `{s['overrides']}`")
    return "\n".join(lines)


def dynamic_depth_markdown(table: pd.DataFrame) -> str:
    """The table as markdown: per batch size, the best static k and its tokens/s, then each mode's tokens/s,
    mean k and ratio to the best static k."""
    from specexp.analysis.report_sections import fmt, markdown_table, spread

    def tokens(r, name: str) -> str:
        return spread(r.get(name), r.get(f"{name}_std"), r.get(f"{name}_n"))

    modes = [m for m in DYNAMIC_MODES if f"{m}_tokens_per_s" in table]
    header = ["group", "batch size", "best static k", "tokens/s (mean ± std, n)"]
    header += [f"{m} {what}" for m in modes for what in ("tokens/s", "mean k", "÷ best static")]
    rows = []
    for _, r in table.iterrows():
        cells = [str(r["group"]), fmt(r["batch_size"]), fmt(r["best_static_k"]), tokens(r, "best_static_tokens_per_s")]
        for m in modes:
            cells += [tokens(r, f"{m}_tokens_per_s"), fmt(r.get(f"{m}_mean_k")), fmt(r.get(f"{m}_ratio"), 3)]
        rows.append(cells)
    return markdown_table(rows, header)


def dynamic_depth_figure(runs: pd.DataFrame):
    """Output tokens/s vs batch size: the best static k (its k labelled at each point) and each dynamic mode, one
    panel per depth group."""
    from specexp.analysis.plot_style import grid, note

    table = dynamic_depth_table(runs)
    if table.empty:
        return note("Dynamic depth vs the best static k", "no runs with a dynamic depth mode")
    groups = list(dict.fromkeys(table["group"]))
    fig, axes = grid(len(groups), min(len(groups), 3), 5.0, 3.5)
    for ax, group in zip(axes, groups, strict=False):
        part = table[table["group"] == group]
        x = part["batch_size"].astype(float)
        ax.plot(x, part["best_static_tokens_per_s"], "k-o", label="best static k")
        for xi, yi, k in zip(x, part["best_static_tokens_per_s"], part["best_static_k"], strict=True):
            if pd.notna(yi) and pd.notna(k):
                ax.annotate(f"k={int(k)}", (xi, yi), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=7)
        for mode in DYNAMIC_MODES:
            if f"{mode}_tokens_per_s" in part:
                ax.plot(x, part[f"{mode}_tokens_per_s"], "--s", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (engine.max_num_seqs)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(str(group)[:60], fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Dynamic depth vs the best static k")
    return fig
