"""Figures over loaded runs. Every function takes the frame of :func:`specexp.analysis.load_runs` (any
number of sweeps and comparison groups: one line per group, at most six groups per axes, or one panel per
group) and returns a matplotlib ``Figure``; none shows or saves it. Titles name the pair, workload,
backend and device (:func:`specexp.analysis.plot_style.subject`), axes their units, and no legend has more
than ten entries. With nothing to plot (no runs, or graph metrics null on CPU) a function returns a figure
that says so instead of raising, so notebooks run top to bottom.

``FIGURES`` maps the file stem used by ``report`` to each function.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from specexp.analysis.graph_plots import graph_memory
from specexp.analysis.groups import GROUP_KEY, GROUP_LABEL
from specexp.analysis.metrics import _ok, per_position, per_request, step_breakdown
from specexp.analysis.plot_style import (
    MAX_GROUPS_PER_AXES,
    chunks,
    grid,
    group_colors,
    groups,
    k_axis,
    k_color,
    k_key,
    legend,
    log_if_wide,
    note,
    panel_title,
    subject,
    title,
    title_with_legend,
)
from specexp.analysis.theory import _column, fit_theory, theory_curve, with_theory

PERCENTILES = ("p50", "p90", "p99")
PERCENTILE_STYLES = {"p50": "-", "p90": "--", "p99": ":"}
PHASE_COLORS = {"schedule": "#9e9e9e", "draft": "#ff7f0e", "verify": "#1f77b4", "sample": "#2ca02c"}


def _errors(group: pd.DataFrame, value: str, low: str, high: str) -> np.ndarray | None:
    """matplotlib ``yerr`` ([2, n]: below, above) of ``value`` from interval columns (0 where unknown);
    ``None`` when no run of ``group`` has an interval."""
    y, lo, hi = _column(group, value), _column(group, low), _column(group, high)
    if lo.isna().all() or hi.isna().all():
        return None
    return np.vstack([(y - lo).clip(lower=0).fillna(0.0).to_numpy(), (hi - y).clip(lower=0).fillna(0.0).to_numpy()])


def _counts(values) -> str:
    """``8`` or ``4-8``: the distinct sample counts of a column, for a legend."""
    present = sorted({int(v) for v in values if pd.notna(v)})
    if not present:
        return "?"
    return str(present[0]) if len(present) == 1 else f"{present[0]}-{present[-1]}"


def _group_axes(runs: pd.DataFrame, panels: int, width: float, height: float):
    """Small multiples for one-line-per-group figures: the groups of ``runs`` in chunks of at most
    :data:`MAX_GROUPS_PER_AXES`, one row of ``panels`` axes per chunk. Returns (fig, [(chunk, axes)])."""
    parts = chunks(list(groups(runs)), MAX_GROUPS_PER_AXES)
    fig, axes = grid(panels * len(parts), panels, width, height)
    return fig, [(part, axes[i * panels:(i + 1) * panels]) for i, part in enumerate(parts)]


def acceptance_vs_k(df: pd.DataFrame) -> Figure:
    """Measured acceptance length (tokens per verification, bonus included) vs k, one line per group, with
    error bars (95% bootstrap over requests; the legend gives the requests and α's interval), Leviathan's
    (1-α^(k+1))/(1-α) at the group's fitted α dashed and the k+1 ceiling dotted."""
    runs = _ok(df)
    if runs.empty:
        return note("Acceptance length vs k", "no finished runs")
    fits = fit_theory(runs)
    k_max = max(int(runs["k"].max()), 1)
    curve = theory_curve(fits, k_max)
    alphas = dict(zip(fits[GROUP_KEY], fits["alpha"]))
    fig, rows = _group_axes(runs, 1, 6.8, 4.4)
    ks = sorted(int(k) for k in runs["k"].dropna().unique())
    for part, (ax,) in rows:
        colors = {}
        for g, (color, (label, key, group)) in enumerate(zip(group_colors(range(len(part))).values(), part)):
            alpha = alphas.get(key, math.nan)
            fit = fits[fits[GROUP_KEY] == key].iloc[0]
            dodge = (g - (len(part) - 1) / 2) * 0.07  # side by side, so the error bars of the groups stay apart
            spread = (f" [{fit['alpha_low']:.2f}, {fit['alpha_high']:.2f}]" if pd.notna(fit.get("alpha_low"))
                      else "")
            n = f", n={_counts(_column(group, 'num_requests'))} req."
            colors[f"{label} (α={alpha:.2f}{spread}{n})" if pd.notna(alpha) else f"{label} (α: no drafts)"] = color
            errors = _errors(group, "acceptance_length", "intervals.acceptance.acceptance_length.low",
                             "intervals.acceptance.acceptance_length.high")
            ax.errorbar(group["k"] + dodge, _column(group, "acceptance_length"), yerr=errors, fmt="o-", color=color,
                        capsize=2, ms=4, elinewidth=1)
            theory = curve[curve[GROUP_KEY] == key]
            ax.plot(theory["k"], theory["theory_acceptance_length"], "--", color=color, alpha=0.7)
        ax.plot(range(k_max + 1), [k + 1 for k in range(k_max + 1)], ":", color="grey", lw=1)
        k_axis(ax, range(k_max + 1) if len(ks) > 1 else ks)
        ax.set_ylabel("acceptance length (tokens / verify)")
        ax.grid(alpha=0.3)
        legend(ax, colors, {"measured": "-", "theory (1-α^(k+1))/(1-α)": "--", "k+1 (all accepted)": ":"})
    title(fig, "Acceptance length vs depth (error bars: 95% bootstrap over requests)", runs)
    return fig


def per_position_curves(df: pd.DataFrame) -> Figure:
    """Per group, unconditional (all of positions 1..i accepted) and conditional (i accepted given 1..i-1)
    acceptance vs draft position, one line per k with its 95% bootstrap band over requests (records that
    have one); the conditional panel shows the fitted α."""
    runs = _ok(df)
    table = per_position(runs)
    if table.empty:
        return note("Per-position acceptance", "no runs with drafts (k >= 1)", runs)
    keys = list(dict.fromkeys(table[GROUP_KEY]))
    fits = fit_theory(runs)
    alphas = dict(zip(fits[GROUP_KEY], fits["alpha"]))
    fig, axes = grid(2 * len(keys), 2, 5.2, 3.4)
    k_max = max(int(table["k"].max()), 1)
    for g, key in enumerate(keys):
        rows = table[table[GROUP_KEY] == key]
        label = rows[GROUP_LABEL].iloc[0]
        unconditional, conditional = axes[2 * g], axes[2 * g + 1]
        for column, ax, meaning in ((
                "unconditional", unconditional, "P(positions 1..i accepted)"),
                ("conditional", conditional, "P(i accepted | 1..i-1 accepted)")):
            for k, run in rows.groupby("k"):
                run = run.groupby("position", as_index=False)[[column, f"{column}_low", f"{column}_high"]].mean()
                color = k_color(int(k), k_max)
                ax.plot(run["position"] + 1, run[column], "o-", ms=3, color=color)
                if run[f"{column}_low"].notna().any():  # the 95% bootstrap band over requests
                    ax.fill_between(run["position"] + 1, run[f"{column}_low"], run[f"{column}_high"], color=color,
                                    alpha=0.15, lw=0)
            ax.set_ylim(0, 1.05)
            ax.set_xticks(range(1, int(rows["position"].max()) + 2))
            ax.set_xlabel("draft position i")
            ax.set_ylabel(meaning, fontsize=9)
            ax.set_title(panel_title(label, column, len(keys)), fontsize=10)
            ax.grid(alpha=0.3)
        alpha = alphas.get(key, math.nan)
        if pd.notna(alpha):
            conditional.axhline(alpha, color="grey", ls="--", lw=1)
            conditional.legend(handles=[Line2D([], [], color="grey", ls="--", label=f"fitted α = {alpha:.2f}")],
                               fontsize=7)
        k_key(fig, unconditional, rows["k"], k_max)
    title(fig, "Per-position acceptance (bands: 95% bootstrap over requests)", runs)
    return fig


def per_request_acceptance(df: pd.DataFrame) -> Figure:
    """Per group, how acceptance is spread over requests: at each k a box (quartiles, whiskers at 1.5 IQR)
    of the requests' acceptance lengths with every request as a dot, and the k+1 ceiling dotted."""
    runs = _ok(df)
    table = per_request(runs).dropna(subset=["acceptance_length"])
    if table.empty:
        return note("Per-request acceptance length", "no runs with per-request acceptance (k >= 1)", runs)
    keys = list(dict.fromkeys(table[GROUP_KEY]))
    fig, axes = grid(len(keys), 3, 4.8, 3.4)
    k_max = max(int(table["k"].max()), 1)
    jitter = np.random.default_rng(0)
    for key, ax in zip(keys, axes):
        rows = table[table[GROUP_KEY] == key]
        ks = sorted(int(k) for k in rows["k"].unique())
        values = [rows.loc[rows["k"] == k, "acceptance_length"].to_numpy(dtype=float) for k in ks]
        ax.boxplot(values, positions=ks, widths=0.6, showfliers=False, medianprops={"color": "black"})
        for k, v in zip(ks, values):
            ax.scatter(k + jitter.uniform(-0.18, 0.18, len(v)), v, s=9, color=k_color(k, k_max), alpha=0.7, zorder=3)
        ax.plot(ks, [k + 1 for k in ks], ":", color="grey", lw=1)
        ax.set_ylim(bottom=0.9)
        k_axis(ax, ks)
        ax.set_ylabel("request acceptance length\n(tokens / verify)")
        ax.set_title(panel_title(rows[GROUP_LABEL].iloc[0], f"{rows['request_id'].nunique()} requests", len(keys)),
                     fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    title(fig, "Per-request acceptance length (box: quartiles; dots: requests; dotted: k+1)", runs)
    return fig


per_request_histogram = per_request_acceptance  # its earlier name


def latency_percentiles(df: pd.DataFrame) -> Figure:
    """TTFT and TPOT (ms) at p50/p90/p99 vs k, one colour per group (at most six groups per row of
    panels; a log scale when a panel's values span more than 100x)."""
    runs = _ok(df)
    if runs.empty:
        return note("Latency percentiles", "no finished runs")
    fig, rows = _group_axes(runs, 2, 5.6, 4.0)
    for part, axes in rows:
        colors = group_colors([label for label, _, _ in part])
        for metric, ax in zip(("ttft_ms", "tpot_ms"), axes):
            values = []
            for label, _, group in part:
                for p in PERCENTILES:
                    column = f"{metric}.{p}"
                    if column in group and group[column].notna().any():
                        y = pd.to_numeric(group[column], errors="coerce")
                        ax.plot(group["k"], y, PERCENTILE_STYLES[p], marker="o", ms=3, color=colors[label])
                        values.extend(y)
            k_axis(ax, runs["k"])
            log_if_wide(ax, values)
            ax.set_ylabel(f"{metric.removesuffix('_ms').upper()} (ms)")
            ax.grid(alpha=0.3)
        legend(axes[0], colors)
        legend(axes[1], {}, dict(zip(PERCENTILES, PERCENTILE_STYLES.values())))
    title(fig, "Latency percentiles vs depth", runs)
    return fig


def throughput_speedup(df: pd.DataFrame) -> Figure:
    """Output tokens/s vs k (mean over repeats, error bars: its 95% t interval; runs flagged noisy circled in
    red), and speedup over k=0 vs k (error bars: 95% from the repeats of both points) with Leviathan's
    predicted speedup (dashed) and the prediction with the measured verify-cost growth (dotted) for the groups
    with a k=0 run; without any k=0 run, tokens/s alone."""
    runs = _ok(df)
    if runs.empty:
        return note("Throughput and speedup", "no finished runs")
    table = with_theory(runs)
    has_baseline = table["speedup"].notna().any()
    fits = fit_theory(runs)
    curve = theory_curve(fits, max(int(runs["k"].max()), 1))
    fig, rows = _group_axes(table, 2 if has_baseline else 1, 5.6, 4.0)
    for part, axes in rows:
        colors = group_colors([label for label, _, _ in part])
        for label, key, group in part:
            axes[0].errorbar(group["k"], _column(group, "output_tokens_per_s"), capsize=3, fmt="o-",
                             yerr=_errors(group, "output_tokens_per_s", "intervals.output_tokens_per_s.low",
                                          "intervals.output_tokens_per_s.high"), color=colors[label])
            noisy = group[_noisy_flags(group)]
            axes[0].scatter(noisy["k"], _column(noisy, "output_tokens_per_s"), s=90, facecolors="none",
                            edgecolors="red", zorder=4)
            if group["speedup"].notna().any():  # theory only where there is a measured speedup to compare
                axes[1].errorbar(group["k"], group["speedup"], yerr=_errors(group, "speedup", "speedup_low",
                                                                            "speedup_high"),
                                 fmt="o-", capsize=3, color=colors[label])
                theory = curve[curve[GROUP_KEY] == key]
                axes[1].plot(theory["k"], theory["theory_speedup"], "--", color=colors[label], alpha=0.7)
                axes[1].plot(group["k"], group["theory_speedup_verify_cost"], ":", color=colors[label], alpha=0.9)
        axes[0].set_ylabel(f"output tokens / s (mean of n={_counts(_column(table, 'num_repeats'))} repeats)")
        for ax in axes:
            k_axis(ax, runs["k"])
            ax.grid(alpha=0.3)
        handles = [Line2D([], [], color=color, marker="o", label=label) for label, color in colors.items()]
        if _noisy_flags(table).any():
            handles.append(Line2D([], [], ls="", marker="o", ms=9, mfc="none", mec="red", label="flagged noisy"))
        axes[0].legend(handles=handles[:10], fontsize=7)
        if has_baseline:
            axes[1].set_ylabel("speedup over k=0 (×)")
            axes[1].axhline(1.0, color="grey", lw=0.8)
            legend(axes[1], {}, {"measured": "-", "Leviathan (verify = 1 target step)": "--",
                                 "with measured verify cost": ":"})
    what = "Throughput and speedup vs depth" if has_baseline else "Throughput (no k=0 run: no speedup)"
    title(fig, f"{what} (error bars: 95% over repeats)", runs)
    return fig


def _noisy_flags(runs: pd.DataFrame) -> pd.Series:
    """Per run, whether its record marks its throughput noisy."""
    from specexp.measure.guards import is_marked

    if "noise.figures" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["noise.figures"].map(lambda m: is_marked({"figures": _figure_list(m)}, "output_tokens_per_s"))


def _figure_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) or hasattr(value, "tolist") else []


def step_time_breakdown(df: pd.DataFrame) -> Figure:
    """Per group, mean time per engine step split into schedule / draft / verify / sample, stacked, vs k
    (decode steps when steps.parquet was loaded, else all steps)."""
    runs = _ok(df)
    table = step_breakdown(runs)
    if table.empty or table["ms"].isna().all():
        return note("Step-time breakdown", "no step timings", runs)
    keys = [key for key in dict.fromkeys(table[GROUP_KEY]) if table.loc[table[GROUP_KEY] == key, "ms"].notna().any()]
    fig, axes = grid(len(keys), 3, 4.8, 3.4)
    for key, ax in zip(keys, axes):
        rows = table[table[GROUP_KEY] == key]
        wide = rows.pivot_table(index="k", columns="phase", values="ms", aggfunc="mean").fillna(0.0)
        bottom = np.zeros(len(wide))
        for phase, color in PHASE_COLORS.items():
            if phase in wide:
                ax.bar(wide.index, wide[phase], bottom=bottom, color=color, label=phase, width=0.7)
                bottom += wide[phase].to_numpy()
        k_axis(ax, wide.index)
        ax.set_ylabel(f"ms per step ({rows['source'].iloc[0]})")
        ax.set_title(panel_title(rows[GROUP_LABEL].iloc[0], "", len(keys)), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    handles = [Patch(color=color, label=phase) for phase, color in PHASE_COLORS.items()]
    title_with_legend(fig, f"Step-time breakdown vs depth\n{subject(runs)}", handles)
    return fig


ACCEPTANCE_FIGURES = ("acceptance_vs_k", "per_position", "per_request_acceptance")  # no timing in them
FIGURES = {
    "acceptance_vs_k": acceptance_vs_k,
    "per_position": per_position_curves,
    "per_request_acceptance": per_request_acceptance,
    "latency_percentiles": latency_percentiles,
    "throughput_speedup": throughput_speedup,
    "step_time_breakdown": step_time_breakdown,
    "graph_memory": graph_memory,
}
