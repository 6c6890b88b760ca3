"""Figures of serving-load sweeps (:mod:`specexp.analysis.load_tables`): one panel per series, one line per k
along the load axis. Every function takes the frame of :func:`specexp.analysis.load_runs` and returns a
matplotlib ``Figure`` (a figure that says so when there is nothing to plot), like :mod:`specexp.analysis.plots`.

- :func:`throughput_vs_load`: output tokens/s against concurrency (or request rate), per k.
- :func:`best_k_vs_batch`: the fastest k at each load, against the mean batch the runs ran.
- :func:`verify_share_vs_batch`: the verification's share of step time against the mean batch, per k.
- :func:`pareto`: tokens/s per user (1000 / TPOT, median) against total output tokens/s, the frontier marked
  (the plot ``vllm bench sweep plot_pareto`` draws).
- :func:`oracle_vs_static`: per load, the measured best speedup, the modelled best static k's and the
  per-step oracle's (:func:`specexp.analysis.load_tables.oracle_table`).

Error bars are 95% intervals: Student's t over each run's repeats for tokens/s, per-user tokens/s and the
verify share; for speedups the interval from the repeats of both points (measured) or over the repeats' step
costs (modelled); the titles say how many repeats. Runs measured once have no bar.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from specexp.analysis.load_tables import (
    SERIES,
    best_k_table,
    load_axis,
    load_table,
    oracle_table,
    with_series,
)
from specexp.analysis.plot_style import grid, k_color, note, panel_title, title

AXIS_LABELS = {"workload.max_concurrency": "requests in flight (workload.max_concurrency)",
               "workload.request_rate": "arrival rate (requests/s, Poisson)",
               "engine.max_num_seqs": "batch limit, all requests at once (engine.max_num_seqs)"}
BATCH_LABEL = "mean batch (requests per step)"


def _panels(table: pd.DataFrame, width: float = 5.2, height: float = 3.6):
    series = list(dict.fromkeys(table[SERIES]))
    fig, axes = grid(len(series), min(len(series), 2), width, height)
    return fig, list(zip(series, axes, strict=True))


def _bars(rows: pd.DataFrame, column: str) -> np.ndarray | None:
    """matplotlib error bars ([2, n]: below, above) of ``column`` from its ``_low`` / ``_high`` columns (0 where
    unknown); ``None`` when no row has an interval."""
    low, high = f"{column}_low", f"{column}_high"
    if low not in rows or rows[low].isna().all():
        return None
    value = pd.to_numeric(rows[column], errors="coerce")
    below = (value - pd.to_numeric(rows[low], errors="coerce")).clip(lower=0).fillna(0.0)
    above = (pd.to_numeric(rows[high], errors="coerce") - value).clip(lower=0).fillna(0.0)
    return np.vstack([below.to_numpy(), above.to_numpy()])


def _k_lines(fig: Figure, ax, table: pd.DataFrame, x: str, y: str, k_max: int) -> None:
    """One line per k of ``y`` against ``x``, with each point's 95% interval as error bars (both axes where
    both have one)."""
    for k, rows in table.groupby("k"):
        rows = rows.dropna(subset=[x, y]).sort_values(x)
        ax.errorbar(rows[x], rows[y], xerr=_bars(rows, x), yerr=_bars(rows, y), marker="o", ms=3, capsize=2,
                    elinewidth=0.8, color=k_color(int(k), k_max), label=f"k={int(k)}")
    ax.legend(fontsize=7, ncol=2)


def _repeats(table: pd.DataFrame, column: str = "output_tokens_per_s") -> str:
    """``n = 3 repeats`` (or ``n = 1-3 repeats``) of ``column`` for a title; "1 repeat, no error bars"."""
    counts = sorted({int(n) for n in table.get(f"{column}_n", pd.Series(dtype=float)).dropna()})
    if not counts or counts[-1] <= 1:
        return "one repeat: no error bars"
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"error bars: 95% t interval over n = {n} repeats"


def _log2(ax, values) -> None:
    values = [v for v in values if pd.notna(v) and v > 0]
    if values and max(values) / min(values) >= 8:
        ax.set_xscale("log", base=2)


def throughput_vs_load(df: pd.DataFrame) -> Figure:
    """Output tokens/s (all requests) against the load, one line per k."""
    table = load_table(df)
    if table.empty:
        return note("Throughput vs load", "no ok runs")
    axis = load_axis(with_series(df))
    fig, panels = _panels(table)
    k_max = int(table["k"].max())
    for series, ax in panels:
        rows = table[table[SERIES] == series]
        _k_lines(fig, ax, rows, "load", "output_tokens_per_s", k_max)
        _log2(ax, rows["load"])
        ax.set(xlabel=AXIS_LABELS.get(axis, axis), ylabel="output tokens/s",
               title=panel_title(series, "", len(panels)))
    title(fig, f"Output tokens/s vs load, per k\n{_repeats(table)}", df)
    return fig


def best_k_vs_batch(df: pd.DataFrame) -> Figure:
    """The k with the most output tokens/s at each load, against the mean batch of that run."""
    best = best_k_table(df)
    if best.empty:
        return note("Best k vs batch", "no ok runs")
    table = load_table(df).set_index([SERIES, "load", "k"])
    best["batch"] = [table.loc[(r[SERIES], r["load"], r["best_k"]), "num_reqs_per_step.mean"]
                     for _, r in best.iterrows()]
    fig, panels = _panels(best)
    for series, ax in panels:
        rows = best[best[SERIES] == series].sort_values("batch")
        ax.step(rows["batch"], rows["best_k"], where="mid", color="#1f77b4")
        ax.scatter(rows["batch"], rows["best_k"], c=rows["speedup"], cmap="RdYlGn", vmin=0.5, vmax=1.5,
                   edgecolor="k", zorder=3)
        for i, (_, r) in enumerate(rows.iterrows()):
            if pd.notna(r["speedup"]):  # labels alternate above and below, so neighbours do not overlap
                ax.annotate(_best_label(r), (r["batch"], r["best_k"]), fontsize=6, xytext=(3, 5 if i % 2 else -18),
                            textcoords="offset points")
        _log2(ax, rows["batch"])
        ax.set(xlabel=BATCH_LABEL, ylabel="fastest k", title=panel_title(series, "", len(panels)))
        ks = sorted(set(load_table(df)["k"]))
        ax.set_yticks(ks)
        ax.set_ylim(min(ks) - 0.8, max(ks) + 0.5)
    title(fig, "Fastest k vs batch\nlabels: speedup over k = 0 [95%, repeats of both points];\nat k = 0: the"
               " runner-up's", df)
    return fig


def _best_label(row: pd.Series) -> str:
    """``1.06x [0.76, 1.48]`` for a fastest k > 0; for k = 0 (speedup 1 by definition) the runner-up's:
    ``k=2: 0.73x [0.45, 1.17]``."""
    def interval(low, high) -> str:
        return f"\n[{low:.2f}, {high:.2f}]" if pd.notna(low) and pd.notna(high) else ""

    if row["best_k"] != 0 or pd.isna(row.get("next_best_speedup")):
        return f"{row['speedup']:.2f}x" + interval(row["speedup_low"], row["speedup_high"])
    return (f"k={int(row['next_best_k'])}: {row['next_best_speedup']:.2f}x"
            + interval(row["next_best_low"], row["next_best_high"]))


def verify_share_vs_batch(df: pd.DataFrame) -> Figure:
    """The mean share of step time spent verifying (target forward + rejection sampling), against the mean
    batch, one line per k."""
    table = load_table(df)
    if table.empty or "verify_share.mean" not in table or table["verify_share.mean"].isna().all():
        return note("Verify share vs batch", "no step times (vLLM records none)", df if not df.empty else None)
    fig, panels = _panels(table)
    k_max = int(table["k"].max())
    for series, ax in panels:
        rows = table[table[SERIES] == series]
        _k_lines(fig, ax, rows, "num_reqs_per_step.mean", "verify_share.mean", k_max)
        _log2(ax, rows["num_reqs_per_step.mean"])
        ax.set_ylim(0, 1)
        ax.set(xlabel=BATCH_LABEL, ylabel="verify share of step time", title=panel_title(series, "", len(panels)))
    title(fig, f"Verification's share of step time vs batch, per k\n{_repeats(table, 'verify_share.mean')}", df)
    return fig


def pareto_front(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The points no other point beats on both ``x`` and ``y`` (higher is better), sorted by ``x``."""
    points = points.dropna(subset=[x, y]).sort_values([x, y], ascending=False)
    front, best_y = [], -np.inf
    for _, p in points.iterrows():
        if p[y] > best_y:
            front.append(p)
            best_y = p[y]
    return pd.DataFrame(front).sort_values(x) if front else points.iloc[:0]


def pareto(df: pd.DataFrame) -> Figure:
    """Tokens/s per user (median of 1000 / TPOT) against total output tokens/s: one point per run, a line per
    k through its loads, the Pareto frontier dashed."""
    table = load_table(df)
    x, y = "tokens_per_s_per_user.p50", "output_tokens_per_s"
    if table.empty or x not in table:
        return note("Per-user vs total tokens/s", "no ok runs")
    fig, panels = _panels(table)
    k_max = int(table["k"].max())
    for series, ax in panels:
        rows = table[table[SERIES] == series]
        _k_lines(fig, ax, rows.sort_values("load"), y, x, k_max)
        front = pareto_front(rows, y, x)
        ax.plot(front[y], front[x], "k--", lw=1, label="frontier")
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles[:10], fontsize=7, ncol=2)
        ax.set(xlabel="total output tokens/s", ylabel="tokens/s per user (1000 / TPOT p50)",
               title=panel_title(series, "", len(panels)))
    title(fig, f"Per-user speed vs total throughput (each point: one load)\n{_repeats(table)}, both axes", df)
    return fig


def oracle_vs_static(df: pd.DataFrame) -> Figure:
    """Per load: speedup over k = 0 of the fastest measured k, of the best static k as modelled from the
    deepest run's steps, and of the per-step hindsight oracle (the bound a k-selection policy can reach)."""
    table = oracle_table(df)
    if table.empty:
        return note("Oracle vs best static vs measured", "no load with a k = 0 run and a deeper run with traces",
                    df if not df.empty else None)
    fig, panels = _panels(table)
    bars = (("measured_speedup", "measured best k", "#1f77b4"),
            ("model_best_static_speedup", "best static k (model)", "#ff7f0e"),
            ("oracle_speedup", "per-step oracle", "#2ca02c"))
    for series, ax in panels:
        rows = table[table[SERIES] == series].sort_values("load")
        positions = np.arange(len(rows))
        for i, (column, _, color) in enumerate(bars):
            ax.bar(positions + (i - 1) * 0.27, rows[column], width=0.27, color=color, yerr=_bars(rows, column),
                   capsize=2, error_kw={"elinewidth": 0.8})
        for p, (_, r) in zip(positions, rows.iterrows(), strict=True):
            ax.annotate(f"k={r['measured_best_k']}/{r['model_best_static_k']}", (p, 0.02), fontsize=6,
                        ha="center", xycoords=("data", "axes fraction"))
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(positions, [f"{v:g}" for v in rows["load"]])
        ax.set(xlabel="load", ylabel="speedup over k = 0", title=panel_title(series, "", len(panels)))
    handles = [Line2D([], [], color=color, lw=6, label=label) for _, label, color in bars]
    panels[0][1].legend(handles=handles, fontsize=7)
    title(fig, "Speedup: measured best k, best static k, per-step oracle\nerror bars: 95%, measured from the"
                 " repeats of both points,\nmodelled: t interval over the repeats' step costs", df)
    return fig


FIGURES = {"throughput_vs_load": throughput_vs_load, "best_k_vs_batch": best_k_vs_batch,
           "verify_share_vs_batch": verify_share_vs_batch, "pareto": pareto, "oracle_vs_static": oracle_vs_static}
