"""Tables and a figure from `dynamic_depth_gpu.py` results: per pair and acceptance, tokens/s of every depth mode
at every batch size (mean ± std over the rounds, n), each mode's ratio to that batch size's best static k with
its 95% interval, the tuned schedule's ratio, and which single static k stays within a tolerance of the best at
every batch size.

    python benchmarks/dynamic_depth_report.py tables RESULTS.json [...] [--tolerance 0.03]    # markdown on stdout
    python benchmarks/dynamic_depth_report.py summary RESULTS.json [...] [--tolerance 0.03]   # one row a pair, rate
    python benchmarks/dynamic_depth_report.py graphs RESULTS.json [...]   # each engine's graphs, memory, capture
    python benchmarks/dynamic_depth_report.py figure OUT.png RESULTS.json [...]

A pair found in several files is shown from the last of them (a later run replaces an earlier one whole), and the
tables say so under them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _interval(ratio: dict) -> str:
    if ratio.get("value") is None:
        return "-"
    if ratio.get("low") is None:
        return f"{ratio['value']:.3f}"
    return f"{ratio['value']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"


def _tokens(summary: dict) -> str:
    std = summary.get("std")
    return f"{summary['mean']:.0f} ± {std:.0f}" if std is not None else f"{summary['mean']:.0f}"


def is_static(mode: str) -> bool:
    return mode.startswith("k") and mode[1:].isdigit()


def single_static_k(cells: dict, tolerance: float) -> tuple[list[str], str, float]:
    """The static modes whose mean tokens/s is within `tolerance` of the best static's at every batch size, and
    the static mode with the best worst-case ratio (with that ratio)."""
    statics = [m for m in cells if is_static(m)]
    batches = list(next(iter(cells.values())))
    best = {b: max(cells[m][b]["output_tokens_per_s"]["mean"] for m in statics) for b in batches}
    worst = {m: min(cells[m][b]["output_tokens_per_s"]["mean"] / best[b] for b in batches) for m in statics}
    within = [m for m in statics if worst[m] >= 1 - tolerance]
    top = max(worst, key=worst.get)
    return within, top, worst[top]


def render_rate(pair: str, rate: str, by_rate: dict, tolerance: float) -> list[str]:
    cells, ratios = by_rate["cells"], by_rate["ratio_to_best_static"]
    batches = list(next(iter(cells.values())))
    n = next(iter(next(iter(cells.values())).values()))["output_tokens_per_s"]["n"]
    label = f"synthetic acceptance {rate}" if rate != "greedy" else "greedy, real acceptance"
    lines = [f"### {pair}, {label}", "",
             f"Output tokens/s, mean ± std over n = {n} interleaved rounds (acceptance length, mean k a decode step):",
             "", "| mode | " + " | ".join(f"batch {b}" for b in batches) + " |",
             "|---|" + "---|" * len(batches)]
    for mode, by_batch in cells.items():
        row = [f"{_tokens(c['output_tokens_per_s'])} ({c['acceptance_length']:.2f}, k {c['mean_k_per_decode_step']:.1f})"
               for c in by_batch.values()]
        lines.append(f"| {mode} | " + " | ".join(row) + " |")
    lines += ["", "Ratio to the best static k at that batch size, 95% interval (delta method over the rounds):", "",
              "| mode | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---|" * len(batches)]
    best_row = [ratios[next(iter(ratios))][b]["best_static"] for b in batches]
    lines.append("| best static | " + " | ".join(best_row) + " |")
    for mode, by_batch in ratios.items():
        if not is_static(mode):
            lines.append(f"| {mode} | " + " | ".join(_interval(x) for x in by_batch.values()) + " |")
    tuned = by_rate.get("tuned_schedule")
    if tuned:
        lines.append("| tuned schedule | " + " | ".join(_interval(tuned["by_batch"][b]["ratio"]) for b in batches)
                     + " |")
        lines += ["", (f"Tuned schedule `{tuned['schedule']}` (each batch size's best static k, K = 8), measured "
                       "in its own rounds alternating with that best static engine.")]
    within, top, worst = single_static_k(cells, tolerance)
    verdict = ", ".join(within) if within else "none"
    lines += ["", (f"Single static k within {100 * tolerance:.0f}% of the best static at every batch size: {verdict} "
                   f"(best worst case: {top}, {worst:.3f} of the best; means)"), ""]
    return lines


def ran_on(result: dict) -> str:
    """What a result ran on: its GPU's name, else its device."""
    machine = result.get("machine", {})
    return machine.get("gpu") or machine.get("device", "unknown machine")


def render(results: list[dict], tolerance: float) -> str:
    lines = []
    for result in results:
        if not result["pairs"]:  # every pair of this file measured again later (`latest_pairs`)
            continue
        m = result["machine"]
        lines += [(f"Measured {m['date']} on {ran_on(result)} (torch {m['torch']}): "
                   f"`dynamic_depth_gpu.py {' '.join(a for a in result['argv'] if not a.startswith('/'))}`; "
                   f"{result['prompt_tokens']}-token prompts, {result['new_tokens']} new tokens, "
                   f"{result['repeats']} rounds; mixed steps {result.get('mixed_steps', 'joined')} "
                   f"(`engine.cudagraph_mixed`)."), ""]
        for pair, entry in result["pairs"].items():
            for rate, by_rate in entry["by_rate"].items():
                lines += render_rate(pair, rate, by_rate, tolerance)
    return "\n".join(lines)


def _worst(by_batch: dict) -> str:
    """The lowest ratio over the batch sizes, with the batch size it was at."""
    b, ratio = min(by_batch.items(), key=lambda item: item[1]["value"])
    return f"{ratio['value']:.3f} (b = {b})"


def render_summary(results: list[dict], tolerance: float) -> str:
    """One row per pair and acceptance: each batch size's best static k, the tuned schedule's ratio to it at every
    batch size (95% interval, rounds per side), the lowest ratio of each other dynamic mode, whether the tuned
    schedule's point estimates all lie within `tolerance`, and the single static k that does as well."""
    percent = f"{100 * tolerance:.0f}%"
    header = ("| pair, acceptance | best static k by batch | tuned schedule / best static, by batch (n a side) "
              f"| lowest ratio of the other modes | tuned within {percent} everywhere | single static k within {percent} |")
    lines = [header,
             "|---|---|---|---|---|---|"]
    for result in results:
        for pair, entry in result["pairs"].items():
            for rate, by_rate in entry["by_rate"].items():
                ratios = by_rate["ratio_to_best_static"]
                batches = list(next(iter(ratios.values())))
                best = " / ".join(ratios[next(iter(ratios))][b]["best_static"] for b in batches)
                tuned = by_rate.get("tuned_schedule")
                if tuned:
                    measured = [tuned["by_batch"][b]["ratio"] for b in batches]
                    cell = "; ".join(f"{b}: {_interval(r)}" for b, r in zip(batches, measured, strict=True))
                    cell += f" (n = {measured[0]['n_numerator']})"
                    verdict = "yes" if all(r["value"] >= 1 - tolerance for r in measured) else "no"
                else:
                    cell, verdict = "not measured", "-"
                others = "; ".join(f"{m} {_worst(by_batch)}" for m, by_batch in ratios.items() if not is_static(m))
                within, top, worst = single_static_k(by_rate["cells"], tolerance)
                single = ", ".join(within) if within else f"none ({top}: {worst:.3f})"
                lines.append(f"| {pair}, {rate} | {best} | {cell} | {others} | {verdict} | {single} |")
    return "\n".join(lines)


def render_graphs(results: list[dict]) -> str:
    """Per pair, each engine's graphs, the fall in free device memory while it captured (MiB) and its capture
    seconds; the tuned schedule's engines too. Where the results record it, also the part of that memory torch's
    caching allocator holds after the capture (the graph pools; the rest is memory outside the allocator)."""
    rows = []
    for result in results:
        for pair, entry in result["pairs"].items():
            engines = dict(entry["engines"])
            for by_rate in entry["by_rate"].values():
                tuned = by_rate.get("tuned_schedule") or {}
                if "engine" in tuned:  # rates with one schedule share its engine: one row
                    engines[f"tuned {tuned['schedule']}"] = tuned["engine"]
            rows += [(pair, name, cost) for name, cost in engines.items() if cost.get("graphs") is not None]
    held = any(cost.get("graph_capture_reserved_bytes") is not None for _, _, cost in rows)

    def mib(value) -> str:
        return "-" if value is None else f"{value / 2**20:.0f}"

    lines = ["| pair | engine | graphs | graph memory MiB |" + (" of it in the allocator MiB |" if held else "")
             + " capture s |", "|---|---|---|---|" + ("---|" if held else "") + "---|"]
    for pair, name, cost in rows:
        capture = cost.get("graph_capture_s")
        allocator = f" {mib(cost.get('graph_capture_reserved_bytes'))} |" if held else ""
        lines.append(f"| {pair} | {name} | {cost['graphs']} | {mib(cost.get('graph_capture_bytes'))} |{allocator} "
                     f"{'-' if capture is None else f'{capture:.1f}'} |")
    return "\n".join(lines)


# The dynamic modes in the order (and colour, C0, C1, ...) the figure draws them.
MODE_ORDER = ("schedule", "confidence", "goodput", "tuned schedule")


def figure(results: list[dict], path: Path) -> None:
    """Per pair and rate, each dynamic mode's ratio to the best static k against batch size, with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(pair, rate, by_rate, r.get("machine", {}).get("gpu", "")) for r in results
              for pair, e in r["pairs"].items() for rate, by_rate in e["by_rate"].items()]
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (pair, rate, by_rate, gpu) in zip(axes.flat, panels, strict=False):
        series = {m: by_rate["ratio_to_best_static"][m] for m in by_rate["ratio_to_best_static"] if not is_static(m)}
        if by_rate.get("tuned_schedule"):
            series["tuned schedule"] = {b: x["ratio"] for b, x in by_rate["tuned_schedule"]["by_batch"].items()}
        for mode, by_batch in series.items():
            offset = MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)
            xs = [int(b) * (1.06 ** (offset - 1)) for b in by_batch]
            ys = [x["value"] for x in by_batch.values()]
            err = [[y - (x["low"] if x["low"] is not None else y) for x, y in zip(by_batch.values(), ys, strict=True)],
                   [(x["high"] if x["high"] is not None else y) - y for x, y in zip(by_batch.values(), ys, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=mode, color=f"C{offset}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhspan(0.97, 1.0, color="grey", alpha=0.15)
        ax.set_ylim(0.4, 1.6)  # wider intervals run off the panel: the tables give them
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (requests in flight)")
        on = f", {gpu.removeprefix('NVIDIA ')}" if gpu else ""
        ax.set_title(f"{pair}\n{'acceptance ' + rate if rate != 'greedy' else 'greedy'}{on}", fontsize=9)
    for row in axes:
        row[0].set_ylabel("tokens/s ÷ best static k's (95% CI)")
    for ax in axes.flat[:len(panels)]:  # panels may show different modes; a mode keeps its colour in every panel
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def latest_pairs(results: list[dict], names: list[str]) -> tuple[list[dict], list[str]]:
    """The results with each pair kept only in the last file that measured it (a later run of a pair, e.g. one
    completing a run that ended early, replaces the earlier one whole: its rates and engines), and one line per
    pair so replaced, naming both files and the GPU of each. results[i] was read from names[i]."""
    last = {pair: i for i, result in enumerate(results) for pair in result["pairs"]}

    def label(i: int) -> str:
        return f"{names[i]} ({ran_on(results[i])})"

    kept, notes = [], []
    for i, result in enumerate(results):
        pairs = {pair: entry for pair, entry in result["pairs"].items() if last[pair] == i}
        for pair in result["pairs"]:
            if last[pair] != i:
                notes.append(f"{pair}: shown from {label(last[pair])}, which replaces its run in {label(i)}.")
        kept.append({**result, "pairs": pairs})
    return kept, notes


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    tables = commands.add_parser("tables", help="markdown tables on stdout")
    tables.add_argument("results", nargs="+")
    tables.add_argument("--tolerance", type=float, default=0.03)
    summary = commands.add_parser("summary", help="one markdown row per pair and acceptance")
    summary.add_argument("results", nargs="+")
    summary.add_argument("--tolerance", type=float, default=0.03)
    graphs = commands.add_parser("graphs", help="each engine's graphs, graph memory and capture time")
    graphs.add_argument("results", nargs="+")
    drawing = commands.add_parser("figure", help="the ratio figure")
    drawing.add_argument("out")
    drawing.add_argument("results", nargs="+")
    args = parser.parse_args(argv)
    results, notes = latest_pairs([json.loads(Path(p).read_text()) for p in args.results],
                                  [Path(p).name for p in args.results])
    if args.command == "figure":
        figure(results, Path(args.out))
        return args.out
    if args.command == "summary":
        text = render_summary(results, args.tolerance)
    elif args.command == "graphs":
        text = render_graphs(results)
    else:
        text = render(results, args.tolerance)
    if notes:
        text += "\n\n" + "\n".join(notes)
    print(text)
    return text


if __name__ == "__main__":
    main()
