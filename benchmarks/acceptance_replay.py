"""Replay each backend's greedy acceptance offline and compare with what it measured (CPU, transformers).

Reads `backends_gpu.py` results (prompts and output token ids per point), replays every speculative point of
one pair under the native, vLLM and hf end-of-request rules (`specexp.analysis.acceptance_replay`) and
prints, per k and backend: the measured counters, whether the replay under the backend's own rule gives
exactly them, and the acceptance length under every rule — the same outputs counted the same way.

    python benchmarks/acceptance_replay.py RESULTS.json [--pair tiny_llama] [--out replay.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specexp.analysis.acceptance_replay import RULES, load_pair, replay_run  # noqa: E402

PAIRS = {"tiny_llama": ("tiny-llama", "tiny-llama-draft"), "tiny_lfm2": ("tiny-lfm2", "tiny-llama-draft"),
         "tiny_lfm2_hybrid": ("tiny-lfm2", "tiny-lfm2-draft")}


def replay_points(points: list[dict], target, draft) -> list[dict]:
    """One row per speculative ok point: measured counters, and the replayed ones under every rule."""
    rows = []
    for p in sorted(points, key=lambda p: (p["k"], p["backend"])):
        if p.get("status") != "ok" or p["k"] < 1 or not p.get("outputs"):
            continue
        replayed = replay_run(target, draft, p["prompt_token_ids"], p["outputs"], p["k"])
        measured = {"num_drafts": p["num_drafts"], "accepted_per_position": p["accepted_per_position"],
                    "acceptance_length": p["acceptance_length"]}
        own = replayed[p["backend"]]
        rows.append({
            "k": p["k"], "backend": p["backend"], "measured": measured,
            "replay_equals_measured": (own.num_drafts == p["num_drafts"]
                                       and own.accepted_per_position == p["accepted_per_position"]),
            "replayed": {rule: {"num_drafts": c.num_drafts, "accepted_per_position": c.accepted_per_position,
                                "acceptance_length": c.acceptance_length, "num_counted_tokens": c.num_counted_tokens}
                         for rule, c in replayed.items()},
        })
    return rows


def render(rows: list[dict]) -> str:
    lines = ["| k | backend | measured AL | drafts / accepted (measured) | replay under its own rule | "
             + " | ".join(f"AL if counted as {r}" for r in RULES) + " |",
             "|---|---|---|---|---|" + "---|" * len(RULES)]
    for r in rows:
        m = r["measured"]
        own = r["replayed"][r["backend"]]
        verdict = "exact" if r["replay_equals_measured"] else (
            f"differs: {own['num_drafts']} / {sum(own['accepted_per_position'])}")
        lines.append(f"| {r['k']} | {r['backend']} | {m['acceptance_length']:.3f} | {m['num_drafts']} / "
                     f"{sum(m['accepted_per_position'])} | {verdict} | "
                     + " | ".join(f"{r['replayed'][rule]['acceptance_length']:.3f}" for rule in RULES) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="JSON written by backends_gpu.py")
    parser.add_argument("--pair", default="tiny_llama", choices=sorted(PAIRS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    data = json.loads(Path(args.results).read_text())
    points = [p for p in data["points"] if p["pair"] == args.pair]
    target, draft = load_pair(*PAIRS[args.pair])
    rows = replay_points(points, target, draft)
    print(render(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"source": args.results, "pair": args.pair, "rows": rows}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
