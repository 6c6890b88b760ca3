"""Layout shared by the figures of :mod:`specexp.analysis.plots`: titles that name what was measured and
where, small multiples instead of crowded axes, legends of at most :data:`MAX_LEGEND_ENTRIES` entries, and
depth (k) shown as a colour with a legend or, for many depths, a colour bar.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from specexp.analysis.groups import GROUP_KEY, GROUP_LABEL, device_of

MAX_LEGEND_ENTRIES = 10
MAX_GROUPS_PER_AXES = 6  # lines of different groups on one axes (their legend leaves room for line styles)
MAX_K_ENTRIES = 9  # depths in a legend; more get a colour bar
SUBJECT_COLUMNS = (("pair.name", "pairs"), ("workload.name", "workloads"), ("backend.name", "backends"))
K_CMAP = "viridis"


def note(title: str, message: str, runs: pd.DataFrame | None = None) -> Figure:
    """A figure that carries only a message (nothing to plot), titled with the runs' subject if given."""
    fig, ax = plt.subplots(figsize=(6, 2.5), layout="constrained")
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, wrap=True, transform=ax.transAxes)
    fig.suptitle(title if runs is None or runs.empty else f"{title}\n{subject(runs)}")
    return fig


def _distinct(series: pd.Series) -> list[str]:
    return [str(v) for v in dict.fromkeys(series) if v is not None and not (isinstance(v, float) and math.isnan(v))]


def subject(runs: pd.DataFrame) -> str:
    """What ``runs`` measured and where, for a title: the pair, workload and backend when all runs share
    them (else how many there are), then the device, e.g. ``tiny_lfm2 · code · native · NVIDIA H200``."""
    parts = []
    for column, plural in SUBJECT_COLUMNS:
        values = _distinct(runs[column]) if column in runs else []
        if len(values) == 1:
            parts.append(values[0])
        elif values:
            parts.append(f"{len(values)} {plural}")
    devices = device_of(runs).split(", ")
    parts.append(devices[0] if len(devices) == 1 else f"{len(devices)} devices")
    return " · ".join(parts)


def title(fig: Figure, text: str, runs: pd.DataFrame) -> None:
    """``text`` over its subject line (:func:`subject`) as the figure's title."""
    fig.suptitle(f"{text}\n{subject(runs)}", fontsize=12)


def panel_title(label: str, text: str, num_groups: int) -> str:
    """``label: text`` for a panel of one of several groups; ``text`` alone when there is one group (the
    figure's title already names it)."""
    if num_groups <= 1:
        return text
    return f"{label}: {text}" if text else label


def groups(runs: pd.DataFrame):
    """(label, key, runs sorted by k) per comparison group, in first-appearance order."""
    for key, group in runs.groupby(GROUP_KEY, sort=False):
        yield group[GROUP_LABEL].iloc[0], key, group.sort_values("k", kind="stable")


def chunks(items: list, size: int) -> list[list]:
    """``items`` in consecutive lists of at most ``size`` (one list, possibly empty, if ``items`` is)."""
    return [items[i:i + size] for i in range(0, len(items), size)] or [[]]


def grid(n: int, ncols: int, width: float = 4.8, height: float = 3.4, **kwargs):
    """(figure, the first ``n`` axes of a grid of ``ncols`` columns); the grid's unused cells are removed."""
    ncols = max(1, min(ncols, n))
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + 0.8), squeeze=False,
                             layout="constrained", **kwargs)
    flat = list(axes.flat)
    for ax in flat[n:]:
        fig.delaxes(ax)
    return fig, flat[:n]


def group_colors(labels) -> dict:
    """A tab10 colour per label, in order (labels past 10 reuse colours; callers keep ≤ 10 per axes)."""
    cmap = plt.get_cmap("tab10")
    return {label: cmap(i % 10) for i, label in enumerate(labels)}


def legend(ax, colors: dict, styles: dict[str, str] | None = None, **kwargs) -> None:
    """One legend entry per coloured label plus one per line style (what the style means)."""
    handles = [Line2D([], [], color=color, marker="o", label=label) for label, color in colors.items()]
    handles += [Line2D([], [], color="grey", linestyle=style, label=meaning) for meaning, style in (styles or {}).items()]
    if handles:
        ax.legend(handles=handles[:MAX_LEGEND_ENTRIES], fontsize=7, **kwargs)


def k_axis(ax, ks) -> None:
    """Integer ticks at the depths ``ks`` and the axis label."""
    ks = sorted({int(k) for k in ks if pd.notna(k)})
    if ks:
        ax.set_xticks(ks)
        if len(ks) == 1:
            ax.set_xlim(ks[0] - 1, ks[0] + 1)
    ax.set_xlabel("k (draft tokens per step)")


def k_color(k: int, k_max: int):
    """The colour of depth ``k`` on the depth colour map."""
    return plt.get_cmap(K_CMAP)(k / max(k_max, 1))


def k_key(fig: Figure, ax, ks, k_max: int, extra: list | None = None) -> None:
    """Say which colour is which depth: a legend (``k=1``, ... plus ``extra`` handles) for up to
    :data:`MAX_K_ENTRIES` depths, else a colour bar for k and a legend of ``extra`` only."""
    ks = sorted({int(k) for k in ks})
    extra = extra or []
    if len(ks) <= MAX_K_ENTRIES:
        handles = [Line2D([], [], color=k_color(k, k_max), marker="o", ms=3, label=f"k={k}") for k in ks]
        ax.legend(handles=(handles + extra)[:MAX_LEGEND_ENTRIES], fontsize=7, ncol=2)
        return
    mappable = plt.cm.ScalarMappable(cmap=K_CMAP, norm=plt.Normalize(0, max(k_max, 1)))
    fig.colorbar(mappable, ax=ax, label="k", pad=0.01)
    if extra:
        ax.legend(handles=extra, fontsize=7)


def log_if_wide(ax, values) -> None:
    """A log y axis when the positive ``values`` span more than a factor of 100 (e.g. a TTFT with queueing
    next to one without), else linear."""
    values = np.asarray([v for v in values if pd.notna(v) and v > 0], dtype=float)
    if len(values) and values.max() / values.min() > 100:
        ax.set_yscale("log")


def title_with_legend(fig: Figure, text: str, handles: list, ncol: int = 6) -> None:
    """Title ``text`` and one figure legend of ``handles`` (at most :data:`MAX_LEGEND_ENTRIES`) centred
    under the axes (the figure must use the constrained layout)."""
    fig.suptitle(text, fontsize=12)
    handles = handles[:MAX_LEGEND_ENTRIES]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", fontsize=8, ncol=min(len(handles), ncol),
                   frameon=False)
