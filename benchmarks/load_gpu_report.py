"""Tables and a figure from `load_gpu.py` results (native and vLLM files): per pair, output tokens/s of every k
at every concurrency (mean ± std over the rounds, n), the best k at each concurrency, TPOT p50/p99 and the verify
share, the mixed steps' cost against a pure verify step, what choosing k could win (the oracle), and native over vLLM at the same (pair, k, concurrency)
with a 95% interval (delta method over the rounds of both).

    python benchmarks/load_gpu_report.py tables NATIVE.json [VLLM.json]                # markdown on stdout
    python benchmarks/load_gpu_report.py figure OUT.png NATIVE.json [VLLM.json]
    python benchmarks/load_gpu_report.py mixed MIXED.json [MIXED.json ...] [--mode joined]

`mixed` tabulates runs of `benchmarks/diagnostics/mixed_step.py`: per pair and batch size, each run's mixed step over
its pure verify step, then the median and the largest over the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specexp.measure.intervals import ratio_interval


def _mean_std(summary: dict | None, digits: int = 0) -> str:
    if not summary or summary.get("mean") is None:
        return "-"
    std = summary.get("std")
    return f"{summary['mean']:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{summary['mean']:.{digits}f}"


def _interval(ratio: dict) -> str:
    if ratio.get("value") is None:
        return "-"
    if ratio.get("low") is None:
        return f"{ratio['value']:.2f}"
    return f"{ratio['value']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"


def _runs(cell: dict, name: str) -> list[float]:
    return [r[name] for r in cell["runs"] if r.get(name) is not None]


def load(paths: list[str]) -> dict[str, dict]:
    """{engine: results} of the files given (each file's `engine`)."""
    out = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        out[data["engine"]] = data
    return out


def depths(data: dict, pair: str) -> dict[str, dict]:
    """{"k<k>": entry} of a pair's results (its other keys, such as "oracle", left out)."""
    return {k: v for k, v in data["pairs"][pair].items() if k.startswith("k")}


def throughput_table(pair: str, data: dict) -> list[str]:
    """Native tokens/s per k and concurrency, the best k, TPOT and verify share of that best k."""
    by_k = depths(data, pair)
    levels = [str(c) for c in data["concurrency"]]
    n = data["repeats"]
    lines = [f"| k \\ concurrency | {' | '.join(levels)} |", "|---|" + "---|" * len(levels)]
    for k, entry in by_k.items():
        cells = entry["cells"]
        lines.append(f"| {k} | " + " | ".join(_mean_std(cells[c]["output_tokens_per_s"]) for c in levels) + " |")
    best = {c: max(by_k, key=lambda k: by_k[k]["cells"][c]["output_tokens_per_s"]["mean"]) for c in levels}
    lines.append("| **best k** | " + " | ".join(best[c] for c in levels) + " |")
    for name, label, digits in (("tpot_ms_p50", "TPOT p50 ms (best k)", 2), ("tpot_ms_p99", "TPOT p99 ms (best k)", 2),
                                ("verify_share", "verify share (best k)", 2),
                                ("acceptance_length", "acceptance length (best k)", 2)):
        lines.append(f"| {label} | " + " | ".join(_mean_std(by_k[best[c]]["cells"][c].get(name), digits)
                                                  for c in levels) + " |")
    lines.append("")
    lines.append(f"Output tokens/s, mean ± std over n = {n} rounds per cell.")
    return lines


def mixed_table(pair: str, data: dict) -> list[str]:
    """Per k and concurrency: the mixed steps' median GPU time over the pure verify steps' (same run)."""
    by_k = depths(data, pair)
    levels = [str(c) for c in data["concurrency"]]
    lines = [f"| k \\ concurrency | {' | '.join(levels)} |", "|---|" + "---|" * len(levels)]
    for k, entry in by_k.items():
        row = []
        for c in levels:
            mixed, pure = _runs(entry["cells"][c], "mixed_step_ms_p50"), _runs(entry["cells"][c], "pure_step_ms_p50")
            row.append(_interval(ratio_interval(mixed, pure)) if mixed and pure else "-")
        lines.append(f"| {k} | " + " | ".join(row) + " |")
    return lines


def ratio_table(pair: str, native: dict, vllm: dict) -> list[str]:
    """Native over vLLM output tokens/s at every k both measured, with 95% intervals."""
    levels = [str(c) for c in native["concurrency"] if str(c) in map(str, vllm["concurrency"])]
    ks = [k for k in depths(native, pair) if k in vllm["pairs"].get(pair, {})]
    lines = [f"| k \\ concurrency | {' | '.join(levels)} |", "|---|" + "---|" * len(levels)]
    for k in ks:
        row = [_interval(ratio_interval(_runs(native["pairs"][pair][k]["cells"][c], "output_tokens_per_s"),
                                        _runs(vllm["pairs"][pair][k]["cells"][c], "output_tokens_per_s")))
               for c in levels]
        lines.append(f"| {k} | " + " | ".join(row) + " |")
        lines.append(f"| {k} vLLM tokens/s | " + " | ".join(
            _mean_std(vllm["pairs"][pair][k]["cells"][c]["output_tokens_per_s"]) for c in levels) + " |")
    return lines


def oracle_table(pair: str, data: dict) -> list[str]:
    """Per concurrency: the measured best k and its speedup over k = 0 (95% interval over the rounds of both), the
    best static k modelled on the deepest k's steps and its speedup, and the per-step oracle's speedup and mean k
    (mean ± std over the rounds)."""
    oracle = data["pairs"][pair].get("oracle")
    if not oracle:
        return []
    by_k = depths(data, pair)
    levels = [str(c) for c in data["concurrency"]]
    rows = {"measured best k": [], "measured speedup [95%]": [], "modelled best static k": [],
            "modelled best static speedup": [], "per-step oracle speedup": [], "oracle mean k": []}
    for c in levels:
        best = max(by_k, key=lambda k: by_k[k]["cells"][c]["output_tokens_per_s"]["mean"])
        cell = oracle["cells"][c]
        rows["measured best k"].append(best)
        rows["measured speedup [95%]"].append(_interval(ratio_interval(
            _runs(by_k[best]["cells"][c], "output_tokens_per_s"), _runs(by_k["k0"]["cells"][c], "output_tokens_per_s")))
            if best != "k0" else "1.00")
        rows["modelled best static k"].append("/".join(f"k{k}" for k in sorted(set(cell["model_best_static_k"]))))
        rows["modelled best static speedup"].append(_mean_std(cell["model_best_static_speedup"], 2))
        rows["per-step oracle speedup"].append(_mean_std(cell["oracle_speedup"], 2))
        rows["oracle mean k"].append(_mean_std(cell["oracle_k_mean"], 1))
    lines = [f"| over k0 \\ concurrency | {' | '.join(levels)} |", "|---|" + "---|" * len(levels)]
    lines += [f"| {name} | " + " | ".join(values) + " |" for name, values in rows.items()]
    return lines


def tables(paths: list[str]) -> str:
    results = load(paths)
    native, vllm = results.get("native"), results.get("vllm")
    out = []
    for pair in (native or vllm)["pairs"]:
        out += [f"### {pair}", ""]
        if native:
            out += ["Native engine:", "", *throughput_table(pair, native), "",
                    "Mixed prefill+verify step over a pure verify step (median GPU times, ratio of round means, "
                    "95% interval):", "", *mixed_table(pair, native), ""]
            oracle = oracle_table(pair, native)
            if oracle:
                out += [f"What choosing k could win (modelled on the k{native['pairs'][pair]['oracle']['max_k']} runs' "
                        "steps with every k's measured step cost by batch size; mean ± std over the rounds):", "",
                        *oracle, ""]
        if native and vllm and pair in vllm["pairs"]:
            out += ["Native over vLLM, output tokens/s (95% interval):", "", *ratio_table(pair, native, vllm), ""]
    return "\n".join(out)


def mixed_runs_table(paths: list[str], mode: str = "joined") -> str:
    """Per (pair, batch b), each mixed_step.py run's median GPU time of its mixed steps of b rows over its pure
    verify steps' (n mixed / pure steps), then the median and the largest of those ratios over the runs that
    measured the cell; markdown. mode: how the runs' mixed steps ran (the runs' `--mixed`)."""
    runs = [json.loads(Path(path).read_text()) for path in paths]
    cells: dict[tuple[str, int], list[dict | None]] = {}
    for i, run in enumerate(runs):
        for pair, modes in run["pairs"].items():
            for batch, cell in modes.get(mode, {}).items():
                cells.setdefault((pair, int(batch)), [None] * len(runs))[i] = cell
    head = " | ".join(f"run {i + 1}" for i in range(len(runs)))
    lines = [f"| pair | b | {head} | median of runs | largest |", "|---|---|" + "---|" * (len(runs) + 2)]
    for (pair, batch), per_run in sorted(cells.items()):
        measured = [c if c and c.get("mixed_over_pure") is not None else None for c in per_run]
        ratios = [c["mixed_over_pure"] for c in measured if c]
        shown = [f"{c['mixed_over_pure']:.2f} (n {c['mixed']['n']} / {c['pure']['n']})" if c else "-"
                 for c in measured]
        summary = [f"{statistics.median(ratios):.2f}", f"{max(ratios):.2f}"] if ratios else ["-", "-"]
        lines.append(f"| {pair} | {batch} | {' | '.join(shown)} | {' | '.join(summary)} |")
    return "\n".join(lines)


def figure(out_png: str, paths: list[str]) -> None:
    """Output tokens/s against concurrency per k, one panel per pair: native solid, vLLM dashed, ± std bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = load(paths)
    pairs = list(next(iter(results.values()))["pairs"])
    fig, axes = plt.subplots(1, len(pairs), figsize=(6 * len(pairs), 4.2), squeeze=False)
    colours = {}
    for ax, pair in zip(axes[0], pairs):
        for engine, style in (("native", "-"), ("vllm", "--")):
            data = results.get(engine)
            if not data or pair not in data["pairs"]:
                continue
            for k, entry in depths(data, pair).items():
                levels = data["concurrency"]
                means = [entry["cells"][str(c)]["output_tokens_per_s"]["mean"] for c in levels]
                stds = [entry["cells"][str(c)]["output_tokens_per_s"]["std"] or 0 for c in levels]
                colour = colours.setdefault(k, f"C{len(colours)}")
                ax.errorbar(levels, means, yerr=stds, fmt=style + "o", color=colour, ms=3, capsize=2,
                            label=f"{engine} {k}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(pair)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tables")
    t.add_argument("files", nargs="+")
    f = sub.add_parser("figure")
    f.add_argument("png")
    f.add_argument("files", nargs="+")
    m = sub.add_parser("mixed")
    m.add_argument("files", nargs="+")
    m.add_argument("--mode", default="joined", help="the runs' --mixed mode to tabulate")
    args = parser.parse_args()
    if args.command == "tables":
        print(tables(args.files))
    elif args.command == "mixed":
        print(mixed_runs_table(args.files, args.mode))
    else:
        figure(args.png, args.files)


if __name__ == "__main__":
    main()
