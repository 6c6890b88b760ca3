"""Figures of the CUDA-graph report (`experiments/2026-11-29-cudagraphs-h200/`), drawn from `gpu_cudagraphs.py`
results (matplotlib; any machine):

    python benchmarks/cudagraphs_figures.py speedup OUT.png RESULT.json ...
        end-to-end speedup over k = 0 against k, measured (the median run; bars: the slowest and fastest run)
        and Leviathan's (1 - a^(k+1)) / ((1 - a)(k c + 1)) with the result's c, its 15% band shaded; one panel
        per pair, one colour per synthetic acceptance rate a
    python benchmarks/cudagraphs_figures.py memory OUT.png LABEL=RESULT.json ...
        graph memory per manager group as stacked bars, one bar per (labelled result, pair) that measured the
        capture (`--sections capture`)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cudagraphs_report import SHORT_PAIR, load, manager_groups, speedup_columns
from leviathan import leviathan_speedup

RATE_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
GROUP_COLORS = {"target verify": "#1f77b4", "target prompt graphs": "#aec7e8", "draft prefill": "#ff7f0e",
                "draft prompt graphs": "#ffbb78", "draft decode": "#2ca02c", "outside the managers": "#c7c7c7"}


def speedup_figure(results: list[dict]):
    """One panel per pair of every result's end-to-end rows: measured speedup per k and rate, and the formula."""
    panels: dict[str, list[tuple[float, float, dict[int, dict]]]] = {}
    for name, rate, c, rows in speedup_columns(results):
        panels.setdefault(name, []).append((rate, c, rows))
    if not panels:
        raise ValueError("no end-to-end rows in the given results (gpu_cudagraphs.py --sections step,e2e)")
    device = results[0]["machine"]["gpu"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels.items(), strict=True):
        for color, (rate, c, rows) in zip(RATE_COLORS, curves, strict=False):
            ks = sorted(rows)
            fine = [k / 10 for k in range(10 * max(ks) + 1)]
            theory = [leviathan_speedup(rate, k, c) for k in ks]
            ax.fill_between(ks, [0.85 * t for t in theory], [1.15 * t for t in theory], color=color, alpha=0.12,
                            linewidth=0)
            ax.plot(fine, [leviathan_speedup(rate, k, c) for k in fine], "--", color=color, linewidth=1,
                    label=f"formula, a = {rate}")
            base = rows[ks[0]]["baseline_tokens_per_s"]
            measured = [rows[k]["speedup"] for k in ks]
            runs = [rows[k].get("output_tokens_per_s_runs", [rows[k]["output_tokens_per_s"]]) for k in ks]
            low = [m - min(r) / base for m, r in zip(measured, runs, strict=True)]
            high = [max(r) / base - m for m, r in zip(measured, runs, strict=True)]
            ax.errorbar(ks, measured, yerr=[low, high], fmt="o", color=color, markersize=4, capsize=2,
                        label=f"measured, a = {rate}")
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_title(f"{SHORT_PAIR.get(name, name)} on {device} (c = {curves[0][1]:.3f})")
        ax.set_xlabel("draft tokens per step k")
        ax.set_ylabel("speedup over k = 0 (x)")
        ax.set_xticks(sorted(curves[0][2]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Batch-1 output tokens/s over k = 0, synthetic acceptance; shaded: within 15% of the formula",
                 fontsize=10)
    fig.tight_layout()
    return fig


def memory_figure(labelled: list[tuple[str, dict]]):
    """Stacked bars of graph memory per manager group, one bar per (label, pair) with a capture section."""
    bars = [(f"{label}\n{SHORT_PAIR.get(name, name)}", manager_groups(pair["capture"]))
            for label, result in labelled for name, pair in result["pairs"].items() if "capture" in pair]
    if not bars:
        raise ValueError("no capture section in the given results (gpu_cudagraphs.py --sections capture)")
    device = labelled[0][1]["machine"]["gpu"]
    height_in = 0.6 * len(bars) + 2.4
    fig, ax = plt.subplots(figsize=(9, height_in))
    names = [name for name, _ in bars]
    left = [0.0] * len(bars)
    for group, color in GROUP_COLORS.items():
        widths = [max(groups[group], 0.0) for _, groups in bars]
        ax.barh(names, widths, left=left, color=color, label=group)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, (_, groups) in enumerate(bars):
        ax.text(groups["total"] + 5, y, f"{groups['total']:.0f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("graph memory, free-memory delta over the capture (MiB)")
    ax.set_title(f"CUDA-graph memory per manager on {device}\n(k = 4, captured sizes up to 64 rows, "
                 "prompt graphs of 16-128 tokens)", fontsize=10)
    ax.set_xlim(0, max(groups["total"] for _, groups in bars) * 1.12)
    ax.grid(axis="x", alpha=0.3)
    legend_in = 0.55  # the legend's two rows below the axes
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, legend_in / height_in, 1, 1))
    return fig


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=["speedup", "memory"])
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("results", nargs="+", help="result JSON files (memory: LABEL=FILE)")
    args = parser.parse_args(argv)
    if args.figure == "memory":
        bad = [r for r in args.results if "=" not in r]
        if bad:
            parser.error(f"memory takes LABEL=RESULT.json, got {bad[0]!r}")
        pairs = [r.split("=", 1) for r in args.results]
    else:
        pairs = [("", r) for r in args.results]
    missing = [path for _, path in pairs if not Path(path).is_file()]
    if missing:
        parser.error(f"no such result file: {', '.join(missing)}")
    try:
        if args.figure == "memory":
            fig = memory_figure([(label, load(path)) for label, path in pairs])
        else:
            fig = speedup_figure([load(path) for _, path in pairs])
    except ValueError as e:
        parser.error(str(e))
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
