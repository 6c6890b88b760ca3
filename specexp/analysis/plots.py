"""Figures over loaded runs. Every function takes the frame of :func:`specexp.analysis.load_runs` (any
number of sweeps and comparison groups; one line or panel per group) and returns a matplotlib
``Figure``; none shows or saves it. With nothing to plot (no runs, or graph metrics null on CPU) a
function returns a figure that says so instead of raising, so notebooks run top to bottom.

``FIGURES`` maps the file stem used by ``report`` to each function.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specexp.analysis.groups import GROUP_KEY, GROUP_LABEL
from specexp.analysis.metrics import (
    _ok,
    graph_capture,
    has_graph_data,
    per_position,
    per_request,
    step_breakdown,
)
from specexp.analysis.theory import fit_theory, theory_curve, with_theory

MIB = 1024 ** 2
PERCENTILES = ("p50", "p90", "p99")
PERCENTILE_STYLES = {"p50": "-", "p90": "--", "p99": ":"}
PHASE_COLORS = {"schedule": "#9e9e9e", "draft": "#ff7f0e", "verify": "#1f77b4", "sample": "#2ca02c"}


def _note(title: str, message: str) -> Figure:
    """A figure that carries only a message (nothing to plot)."""
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, wrap=True, transform=ax.transAxes)
    fig.suptitle(title)
    return fig


def _colors(labels) -> dict:
    cmap = plt.get_cmap("tab10")
    return {label: cmap(i % 10) for i, label in enumerate(labels)}


def _groups(runs: pd.DataFrame):
    """(label, key, runs sorted by k) per comparison group, in first-appearance order."""
    for key, group in runs.groupby(GROUP_KEY, sort=False):
        yield group[GROUP_LABEL].iloc[0], key, group.sort_values("k")


def _grid(n: int, ncols: int, width: float = 4.5, height: float = 3.2):
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, list(axes.flat)


def _legend(ax, colors: dict, styles: dict[str, str]) -> None:
    """One legend entry per group (its colour) plus one per line style (what the style means)."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=color, marker="o", label=label) for label, color in colors.items()]
    handles += [Line2D([], [], color="grey", linestyle=style, label=meaning) for meaning, style in styles.items()]
    ax.legend(handles=handles, fontsize=7)


def _k_axis(ax, ks) -> None:
    ks = sorted({int(k) for k in ks if pd.notna(k)})
    if ks:
        ax.set_xticks(ks)
    ax.set_xlabel("k (num_speculative_tokens)")


def acceptance_vs_k(df: pd.DataFrame) -> Figure:
    """Measured acceptance length (tokens per verification) vs k, per group, with Leviathan's
    (1-α^(k+1))/(1-α) at the fitted α dashed."""
    runs = _ok(df)
    if runs.empty:
        return _note("Acceptance length vs k", "no finished runs")
    fits = fit_theory(runs)
    curve = theory_curve(fits, int(runs["k"].max()))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    alphas = dict(zip(fits[GROUP_KEY], fits["alpha"]))
    colors = {}
    for label, key, group in _groups(runs):
        color = plt.get_cmap("tab10")(len(colors) % 10)
        colors[f"{label} (α={alphas[key]:.2f})"] = color
        ax.plot(group["k"], group["acceptance_length"], "o-", color=color)
        theory = curve[curve[GROUP_KEY] == key]
        ax.plot(theory["k"], theory["theory_acceptance_length"], "--", color=color, alpha=0.7)
    ks = sorted(runs["k"].dropna().unique())
    ax.plot(ks, [k + 1 for k in ks], ":", color="grey", lw=1)
    _k_axis(ax, ks)
    ax.set_ylabel("acceptance length (tokens / verify)")
    ax.set_title("Acceptance length vs depth")
    _legend(ax, colors, {"measured": "-", "theory (1-α^(k+1))/(1-α)": "--", "k+1 (all accepted)": ":"})
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def per_position_curves(df: pd.DataFrame) -> Figure:
    """Per group, unconditional (all of 0..i accepted) and conditional (i accepted given 0..i-1)
    acceptance vs draft position, one line per k."""
    table = per_position(df)
    if table.empty:
        return _note("Per-position acceptance", "no runs with drafts (k >= 1)")
    groups = list(dict.fromkeys(table[GROUP_LABEL]))
    alphas = fit_theory(df).set_index(GROUP_LABEL)["alpha"]
    fig, axes = _grid(2 * len(groups), 2)
    cmap = plt.get_cmap("viridis")
    k_max = max(int(table["k"].max()), 1)
    for g, label in enumerate(groups):
        rows = table[table[GROUP_LABEL] == label]
        for column, ax in zip(("unconditional", "conditional"), axes[2 * g: 2 * g + 2]):
            for k, run in rows.groupby("k"):
                ax.plot(run["position"] + 1, run[column], "o-", ms=3, color=cmap(k / k_max), label=f"k={k}")
            ax.set_ylim(0, 1.05)
            ax.set_xlabel("draft position")
            ax.set_ylabel(f"{column} acceptance")
            ax.set_title(f"{label}: {column}", fontsize=10)
            ax.grid(alpha=0.3)
        axes[2 * g + 1].axhline(alphas.get(label, np.nan), color="grey", ls="--", lw=1, label="fitted α")
        axes[2 * g].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def per_request_histogram(df: pd.DataFrame) -> Figure:
    """Per group, the distribution over requests of each request's acceptance length, one step
    histogram per k (how evenly acceptance is spread across prompts)."""
    table = per_request(df).dropna(subset=["acceptance_length"])
    if table.empty:
        return _note("Per-request acceptance length", "no runs with drafts (k >= 1)")
    groups = list(dict.fromkeys(table[GROUP_LABEL]))
    fig, axes = _grid(len(groups), min(3, len(groups)))
    cmap = plt.get_cmap("viridis")
    k_max = max(int(table["k"].max()), 1)
    for label, ax in zip(groups, axes):
        rows = table[table[GROUP_LABEL] == label]
        bins = np.linspace(1, k_max + 1, 2 * k_max + 1)
        for k, run in rows.groupby("k"):
            ax.hist(run["acceptance_length"], bins=bins, histtype="step", lw=1.5, color=cmap(k / k_max),
                    label=f"k={k} (n={len(run)})")
        ax.set_xlabel("request acceptance length")
        ax.set_ylabel("requests")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle("Per-request acceptance length")
    fig.tight_layout()
    return fig


def latency_percentiles(df: pd.DataFrame) -> Figure:
    """TTFT and TPOT (ms) at p50/p90/p99 vs k, per group."""
    runs = _ok(df)
    if runs.empty:
        return _note("Latency percentiles", "no finished runs")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = _colors(dict.fromkeys(label for label, _, _ in _groups(runs)))
    for metric, ax in zip(("ttft_ms", "tpot_ms"), axes):
        for label, _, group in _groups(runs):
            for p in PERCENTILES:
                column = f"{metric}.{p}"
                if column in group and group[column].notna().any():
                    ax.plot(group["k"], group[column], PERCENTILE_STYLES[p], marker="o", ms=3, color=colors[label])
        _k_axis(ax, runs["k"])
        ax.set_ylabel(f"{metric.removesuffix('_ms').upper()} (ms)")
        ax.grid(alpha=0.3)
    _legend(axes[0], colors, {})
    _legend(axes[1], {}, dict(zip(PERCENTILES, PERCENTILE_STYLES.values())))
    fig.suptitle("Latency percentiles vs depth")
    fig.tight_layout()
    return fig


def throughput_speedup(df: pd.DataFrame) -> Figure:
    """Output tokens/s vs k, and speedup over k=0 vs k with Leviathan's predicted speedup (dashed) and
    the prediction with the measured verify-cost growth (dotted)."""
    runs = _ok(df)
    if runs.empty:
        return _note("Throughput and speedup", "no finished runs")
    table = with_theory(runs)
    fits = fit_theory(runs)
    curve = theory_curve(fits, int(runs["k"].max()))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = _colors(dict.fromkeys(label for label, _, _ in _groups(table)))
    for label, key, group in _groups(table):
        axes[0].plot(group["k"], group["output_tokens_per_s"], "o-", color=colors[label])
        axes[1].plot(group["k"], group["speedup"], "o-", color=colors[label])
        theory = curve[curve[GROUP_KEY] == key]
        axes[1].plot(theory["k"], theory["theory_speedup"], "--", color=colors[label], alpha=0.7)
        axes[1].plot(group["k"], group["theory_speedup_verify_cost"], ":", color=colors[label], alpha=0.9)
    axes[0].set_ylabel("output tokens / s")
    axes[1].set_ylabel("speedup over k=0")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    for ax in axes:
        _k_axis(ax, runs["k"])
        ax.grid(alpha=0.3)
    _legend(axes[0], colors, {})
    _legend(axes[1], {}, {"measured": "-", "Leviathan (verify = 1 target step)": "--",
                          "with measured verify cost": ":"})
    fig.suptitle("Throughput and speedup vs depth")
    fig.tight_layout()
    return fig


def step_time_breakdown(df: pd.DataFrame) -> Figure:
    """Per group, mean time per engine step split into schedule / draft / verify / sample, stacked, vs k
    (decode steps when steps.parquet was loaded)."""
    table = step_breakdown(df)
    if table.empty or table["ms"].isna().all():
        return _note("Step-time breakdown", "no step timings")
    groups = list(dict.fromkeys(table[GROUP_LABEL]))
    fig, axes = _grid(len(groups), min(3, len(groups)))
    for label, ax in zip(groups, axes):
        rows = table[table[GROUP_LABEL] == label]
        wide = rows.pivot_table(index="k", columns="phase", values="ms", aggfunc="mean").fillna(0.0)
        bottom = np.zeros(len(wide))
        for phase, color in PHASE_COLORS.items():
            if phase in wide:
                ax.bar(wide.index, wide[phase], bottom=bottom, color=color, label=phase)
                bottom += wide[phase].to_numpy()
        _k_axis(ax, wide.index)
        ax.set_ylabel(f"ms per step ({rows['source'].iloc[0]})")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("Step-time breakdown vs depth")
    fig.tight_layout()
    return fig


def graph_memory(df: pd.DataFrame) -> Figure:
    """CUDA-graph memory (MiB) and capture time (s) per captured size and manager, and the run totals
    vs k by max_num_seqs. Says "no GPU graph data" when the runs have none (CPU: graph metrics null)."""
    runs = _ok(df)
    if runs.empty:
        return _note("CUDA-graph memory", "no finished runs")
    if not has_graph_data(runs):
        return _note("CUDA-graph memory", "no GPU graph data: these runs captured no CUDA graphs\n"
                     "(graph metrics are null on CPU; run with engine=cuda)")
    per_size = graph_capture(runs)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    if per_size.empty:
        for ax in axes[:2]:
            ax.text(0.5, 0.5, "no per-size data", ha="center", va="center", transform=ax.transAxes)
    for (k, manager), rows in per_size.groupby(["k", "manager"]):
        # A size captured at several key-length buckets costs their sum; runs of the same k are averaged.
        rows = rows.groupby(["run_dir", "size"], as_index=False)[["capture_bytes", "capture_s"]].sum()
        rows = rows.groupby("size", as_index=False)[["capture_bytes", "capture_s"]].mean().sort_values("size")
        axes[0].plot(rows["size"], rows["capture_bytes"] / MIB, "o-", ms=3, label=f"{manager} k={k}")
        axes[1].plot(rows["size"], rows["capture_s"], "o-", ms=3, label=f"{manager} k={k}")
    for ax, unit in zip(axes[:2], ("graph memory (MiB)", "capture time (s)")):
        ax.set_xlabel("captured size")
        ax.set_ylabel(unit)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    totals = runs.dropna(subset=["graph_capture_bytes"])
    for seqs, rows in totals.groupby(totals.get("engine.max_num_seqs", pd.Series(0, index=totals.index))):
        rows = rows.sort_values("k")
        axes[2].plot(rows["k"], rows["graph_capture_bytes"].astype(float) / MIB, "o-", label=f"max_num_seqs={seqs}")
    _k_axis(axes[2], totals["k"])
    axes[2].set_ylabel("total graph memory (MiB)")
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.suptitle("CUDA-graph memory and capture time")
    fig.tight_layout()
    return fig


FIGURES = {
    "acceptance_vs_k": acceptance_vs_k,
    "per_position": per_position_curves,
    "per_request_histogram": per_request_histogram,
    "latency_percentiles": latency_percentiles,
    "throughput_speedup": throughput_speedup,
    "step_time_breakdown": step_time_breakdown,
    "graph_memory": graph_memory,
}
