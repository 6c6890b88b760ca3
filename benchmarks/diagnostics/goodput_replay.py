"""Replay `speculator.adaptive: goodput` on a stored run's step-cost table, on a CPU: which k the policy picks at each
batch size, against what the GPU run measured, so the estimator can be studied without a GPU.

A `dynamic_depth_gpu.py` result records, per pair, the goodput engine's start-up cost table (`step_costs`) and every
mode's measured cells. For each pair with such a table, each synthetic acceptance rate of the file and each batch
size b, this script serves the run's workload through the real policy (`specexp.engine.goodput.GoodputDepth`, the
engine's class and settings): max(8, b) requests of `new_tokens` tokens, at most b at once (a request is admitted
when one finishes, as `generate(max_concurrency=b)` admits it), every draft accepted with the rate's probability
given the ones before it, each row drafting min(k, tokens left - 1). Steps are counted, not timed: prompt steps are
not modelled.

Per cell it prints the simulated mean k a step (mean over `--seeds` simulations) beside the run's measured mean k,
the k the table would pick knowing the true rate (argmax E(k) / t(k)) and the run's best static k; the replayed
runs' tokens/s over the best static k's, each replayed step timed at the wall time per step the run's static cells
took at its k (prompt steps included; linear between measured ks), beside the ratio the run measured; and the
table's own cost of each k against those static cells. Estimator settings can be changed (`--prior`,
`--ema-weight`) to see what they would have done on the same table; a run takes them as
`speculator.goodput_prior_acceptance` and `speculator.goodput_ema_weight`.

What the replay leaves out: the goodput engine's own cost at a k (its steps ran 2-5% slower than a static engine's
at the same k in the 2026-12-05 H200 runs, so the replayed ratio sits above the measured one), and how the prompt
steps' share of a run changes with the number of steps (a replayed step is charged a static run's wall time per
step, prompt steps included): read the replayed ratio as a comparison between estimator settings, not a forecast.

    python benchmarks/diagnostics/goodput_replay.py RESULTS.json [...] [--seeds 5] [--prior 0.7] [--ema-weight 0.1]
                                                   [--out replay.json]

Needs only torch-free parts of specexp (numpy); runs on any machine.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)

from specexp.engine.goodput import GoodputDepth, GoodputSettings, StepCostTable, best_depth
from specexp.engine.request import Request

MIN_PROMPTS = 8  # dynamic_depth_gpu.num_prompts: max(8, b) requests a run


def cost_table(step_costs: dict) -> StepCostTable:
    """A stored `StepCostTable.to_dict()` back as a table."""
    by_size = {name: {int(size): value for size, value in step_costs[name].items()}
               for name in ("verify_ms", "draft_ms", "fixed_ms")}
    return StepCostTable(by_size["verify_ms"], by_size["draft_ms"], by_size["fixed_ms"])


def replay(table: StepCostTable, batch: int, rate: float, new_tokens: int, max_k: int, seed: int,
           settings: GoodputSettings) -> list[int]:
    """The k of every step of one simulated run (see the module docstring): max(8, batch) requests, at most
    `batch` at once, each to `new_tokens` tokens (the first one from its prefill). The run emits
    max(8, batch) * (new_tokens - 1) tokens in its steps."""
    rng = random.Random(seed)
    policy = GoodputDepth(max_k, table, settings)
    waiting = [Request(i, [1], new_tokens) for i in range(max(MIN_PROMPTS, batch))]
    running: list[Request] = []
    depths = []
    while waiting or running:
        while waiting and len(running) < batch:
            request = waiting.pop(0)
            request.token_ids.append(0)  # the token its prefill sampled
            running.append(request)
        k = policy.step_k([SimpleNamespace(request=r, samples=True) for r in running])
        depths.append(k)
        for request in running:
            left = new_tokens - request.num_output_tokens
            drafts = min(k, left - 1)
            accepted = 0
            while accepted < drafts and rng.random() < rate:
                accepted += 1
            if drafts > 0:
                request.verifies.append((drafts, accepted))
            request.token_ids.extend([0] * min(accepted + 1, left))
        running = [r for r in running if r.num_output_tokens < new_tokens]
    return depths


def measured_step_ms(statics: dict[int, dict], batch_name: str, max_k: int) -> list[float]:
    """Wall ms per step of the run's static cells at this batch size (prompt steps included), for k = 0..max_k:
    measured where a static k ran, linear between the nearest measured k elsewhere (the ends held)."""
    known = {k: statistics.mean(run["wall_s"] / run["steps"] * 1e3 for run in cell[batch_name]["runs"])
             for k, cell in statics.items()}
    ks = sorted(known)
    out = []
    for k in range(max_k + 1):
        below, above = max((j for j in ks if j <= k), default=ks[0]), min((j for j in ks if j >= k), default=ks[-1])
        share = 0.0 if above == below else (k - below) / (above - below)
        out.append(known[below] + share * (known[above] - known[below]))
    return out


def replay_file(result: dict, seeds: int, settings: GoodputSettings) -> list[dict]:
    """One row per (pair, rate, batch) of a result whose pair has a goodput engine and synthetic rates."""
    rows = []
    for pair, entry in result["pairs"].items():
        costs = (entry["engines"].get("goodput") or {}).get("step_costs")
        if not costs:
            continue
        table = cost_table(costs)
        max_k = len(next(iter(table.verify_ms.values()))) - 1
        for rate_name, by_rate in entry["by_rate"].items():
            if rate_name == "greedy":  # a trained pair's acceptance is not one rate: nothing to draw from
                continue
            rate = float(rate_name)
            cells = by_rate["cells"]
            statics = {int(m[1:]): c for m, c in cells.items() if m.startswith("k") and m[1:].isdigit()}
            for batch_name, measured in cells["goodput"].items():
                batch = int(batch_name)
                runs = [replay(table, batch, rate, result["new_tokens"], max_k, seed, settings)
                        for seed in range(seeds)]
                means = [statistics.mean(depths) for depths in runs]
                best_static = max(statics, key=lambda k: statics[k][batch_name]["output_tokens_per_s"]["mean"])
                best_tps = statics[best_static][batch_name]["output_tokens_per_s"]["mean"]
                # each replayed run timed with the static cells' wall time per step at its ks
                wall_ms = measured_step_ms(statics, batch_name, max_k)
                tokens = max(MIN_PROMPTS, batch) * (result["new_tokens"] - 1)
                replayed = [tokens / sum(wall_ms[k] for k in depths) * 1e3 / best_tps for depths in runs]
                step_ms = table.step_ms_by_k(batch, max_k)
                rows.append({
                    "pair": pair, "rate": rate, "batch": batch,
                    "simulated_mean_k": statistics.mean(means),
                    "simulated_mean_k_std": statistics.stdev(means) if seeds > 1 else None, "seeds": seeds,
                    "measured_mean_k": measured["mean_k_per_decode_step"],
                    "replayed_ratio_to_best_static": statistics.mean(replayed),
                    "measured_ratio_to_best_static": measured["output_tokens_per_s"]["mean"] / best_tps,
                    # the policy's own choice for one request that can use every draft, at the true rate
                    "table_best_k": best_depth([rate] * max_k, max_k, table, batch, max_k),
                    "best_static_k": best_static,
                    "table_step_ms": {k: step_ms[k] for k in sorted(statics)},
                    "measured_step_ms": {k: wall_ms[k] for k in sorted(statics)}})
    return rows


def render(rows: list[dict]) -> str:
    """Two markdown tables: the policy's mean k, simulated and measured, with the table's and the run's best k;
    then each k's step time, the table's against the run's."""
    header = ("| pair | rate | batch | mean k simulated (n seeds) | mean k measured | table's best k at the rate "
              "| best static k measured | ÷ best static: replayed / measured |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spread = f" ± {r['simulated_mean_k_std']:.2f}" if r["simulated_mean_k_std"] is not None else ""
        lines.append(f"| {r['pair']} | {r['rate']} | {r['batch']} | {r['simulated_mean_k']:.2f}{spread} "
                     f"(n = {r['seeds']}) | {r['measured_mean_k']:.2f} | k{r['table_best_k']} | "
                     f"k{r['best_static_k']} | {r['replayed_ratio_to_best_static']:.3f} / "
                     f"{r['measured_ratio_to_best_static']:.3f} |")
    caption = "Step time by k, ms: the table's t(k) / the run's static cells (wall s / steps, prompt steps included)"
    lines += ["", caption, "",
              "| pair | rate | batch | " + " | ".join(f"k{k}" for k in rows[0]["table_step_ms"]) + " |",
              "|---|---|---|" + "---|" * len(rows[0]["table_step_ms"])]
    for r in rows:
        cells = " | ".join(f"{r['table_step_ms'][k]:.2f} / {r['measured_step_ms'][k]:.2f}" for k in r["table_step_ms"])
        lines.append(f"| {r['pair']} | {r['rate']} | {r['batch']} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="dynamic_depth_gpu.py JSON files")
    parser.add_argument("--seeds", type=int, default=5, help="simulated runs per cell (different acceptance draws)")
    parser.add_argument("--prior", type=float, default=GoodputSettings.prior_acceptance)
    parser.add_argument("--ema-weight", type=float, default=GoodputSettings.ema_weight)
    parser.add_argument("--out", default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: at least 1")
    if not 0 < args.prior < 1 or not 0 < args.ema_weight <= 1:
        parser.error(f"--prior {args.prior} must be in (0, 1) and --ema-weight {args.ema_weight} in (0, 1]")
    settings = GoodputSettings(prior_acceptance=args.prior, ema_weight=args.ema_weight)
    rows = []
    for path in args.results:
        try:
            result = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"{path}: not a readable JSON file ({exc})")
        rows += replay_file(result, args.seeds, settings)
    if not rows:
        parser.error("no pair of these files has a goodput engine's step costs and a synthetic acceptance rate")
    text = render(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps({"prior": args.prior, "ema_weight": args.ema_weight, "rows": rows},
                                             indent=1))
    return text


if __name__ == "__main__":
    main()
