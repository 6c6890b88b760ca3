"""Replay each backend's greedy acceptance offline and compare with what it measured (CPU, transformers).

Reads `backends_gpu.py` results (prompts and output token ids per point), replays every speculative point of
one pair under the native, vLLM and hf end-of-request rules (`specexp.analysis.acceptance_replay`) and
prints, per k and backend: the measured counters, whether the replay under the backend's own rule gives
exactly them, and the acceptance length under every rule — the same outputs counted the same way.

    python benchmarks/acceptance_replay.py RESULTS.json [--pair tiny_llama] [--out replay.json]
    python benchmarks/acceptance_replay.py --stored REPLAY.json ...   # tables of earlier replays (their --out)

The replay runs one draft forward per request on the CPU (minutes on two cores); `--stored` prints what earlier
replays found, each replay's table and then one summary row per file, without replaying.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specexp.analysis.acceptance_replay import RULES, load_pair, replay_run

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


def render_summary(replays: list[tuple[str, dict]]) -> str:
    """One row per stored replay (file name, its --out content): points replayed, and how many of them the replay
    under the backend's own rule reproduces exactly."""
    lines = ["| file | pair | speculative points | replay equals measured |", "|---|---|---|---|"]
    for name, replay in replays:
        rows = replay["rows"]
        lines.append(f"| `{name}` | {replay['pair']} | {len(rows)} | "
                     f"{sum(r['replay_equals_measured'] for r in rows)} of {len(rows)} |")
    return "\n".join(lines)


def render_stored(paths: list[str]) -> str:
    """Each stored replay's table, then the summary over all of them."""
    replays = [(Path(p).name, json.loads(Path(p).read_text())) for p in paths]
    bad = [name for name, replay in replays if "rows" not in replay]
    if bad:
        raise ValueError(f"{bad[0]} is not a replay written by --out (no 'rows'); replay a backends_gpu.py "
                         "result without --stored")
    parts = [f"#### {replay['pair']} (`{name}`)\n\n{render(replay['rows'])}\n" for name, replay in replays]
    return "\n".join([*parts, render_summary(replays)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+",
                        help="JSON written by backends_gpu.py (one); with --stored, replays written by --out")
    parser.add_argument("--pair", default="tiny_llama", choices=sorted(PAIRS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--stored", action="store_true", help="print the tables of earlier replays; replay nothing")
    args = parser.parse_args()
    missing = [p for p in args.results if not Path(p).is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if args.stored:
        try:
            print(render_stored(args.results))
        except ValueError as e:
            parser.error(str(e))
        return
    if len(args.results) != 1:
        parser.error(f"the replay reads one backends_gpu.py result, got {len(args.results)} (tables of several "
                     "earlier replays: --stored)")
    data = json.loads(Path(args.results[0]).read_text())
    points = [p for p in data["points"] if p["pair"] == args.pair]
    target, draft = load_pair(*PAIRS[args.pair])
    rows = replay_points(points, target, draft)
    print(render(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"source": args.results[0], "pair": args.pair, "rows": rows}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
