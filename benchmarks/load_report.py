"""Tables of a serving-load sweep (`+exp=load_sweep` / `+exp=rate_sweep`) from its run records, as markdown:

    python benchmarks/load_report.py RUNS [--replay]

RUNS: a sweep directory (or any directory of runs). Prints, per series: output tokens/s, TPOT, tokens/s per
user, the mean batch and the verify share by load and k; the fastest k at each load; and the oracle table
(measured best vs the best static k modelled on the deepest run's steps vs the per-step hindsight oracle).
`--replay` completes the deepest run's unobserved draft positions with one draft forward a request (the
trained pair's checkpoints, `specexp.analysis.acceptance_replay.load_pair`), so the replayed acceptance of
every k is exact; it prints that next to what each k measured.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specexp.analysis import load_runs
from specexp.analysis.load_tables import SERIES, best_k_table, load_table, oracle_table


def _fmt(value, digits: int = 1) -> str:
    if value is None or value != value:  # None or NaN
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pivot_table(table, column: str, digits: int) -> str:
    """Loads down, k across: ``column`` of each run."""
    ks = sorted(int(k) for k in table["k"].unique())
    rows = []
    for load, group in table.groupby("load", sort=True):
        values = group.set_index("k")[column]
        rows.append([f"{load:g}", *[_fmt(values.get(k), digits) for k in ks]])
    return _markdown(["load", *[f"k={k}" for k in ks]], rows)


def print_tables(runs_dir: str, replay: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_runs(runs_dir, status="ok")
    table = load_table(runs)
    draft_pair = None
    if replay:
        from specexp.analysis.acceptance_replay import load_pair

        draft_pair = load_pair(runs["pair.target.path"].iloc[0], runs["pair.draft.path"].iloc[0])
    oracle = oracle_table(runs, draft_pair)
    best = best_k_table(runs)
    for series, rows in table.groupby(SERIES, sort=True):
        print(f"### {series}\n")
        for column, title, digits in (("output_tokens_per_s", "Output tokens/s", 0),
                                      ("tpot_ms.p50", "TPOT p50 (ms)", 1), ("tpot_ms.p99", "TPOT p99 (ms)", 1),
                                      ("tokens_per_s_per_user.p50", "Tokens/s per user (1000 / TPOT, p50)", 0),
                                      ("num_reqs_per_step.mean", "Mean batch (requests per step)", 1),
                                      ("verify_share.mean", "Verify share of step time (mean)", 2)):
            print(f"{title}\n\n{pivot_table(rows, column, digits)}\n")
        mine = best[best[SERIES] == series]
        print("Fastest k per load\n")
        print(_markdown(["load", "fastest k", "its tokens/s", "k=0 tokens/s", "speedup"],
                        [[f"{r.load:g}", r.best_k, _fmt(r.output_tokens_per_s, 0), _fmt(r.output_tokens_per_s_k0, 0),
                          _fmt(r.speedup, 2)] for r in mine.itertuples()]) + "\n")
        if oracle.empty:
            continue
        mine = oracle[oracle[SERIES] == series]
        print("Oracle vs best static vs measured (speedup over k = 0)\n")
        print(_markdown(["load", "measured best k", "measured", "modelled best static k", "modelled",
                         "per-step oracle", "oracle mean k"],
                        [[f"{r.load:g}", r.measured_best_k, _fmt(r.measured_speedup, 2), r.model_best_static_k,
                          _fmt(r.model_best_static_speedup, 2), _fmt(r.oracle_speedup, 2), _fmt(r.oracle_k_mean, 2)]
                         for r in mine.itertuples()]) + "\n")
        replay_columns = sorted((c for c in mine.columns if c.startswith("replay_al_k")),
                                key=lambda c: int(c.removeprefix("replay_al_k")))
        if replay_columns:
            measured = rows.set_index(["load", "k"])["acceptance_length"]
            print("Acceptance length: replayed from the deepest run (exact: "
                  f"{'yes' if mine['replay_exact'].all() else 'no'}) / measured at that k\n")
            print(_markdown(["load", *[c.removeprefix("replay_al_") for c in replay_columns]],
                            [[f"{r['load']:g}", *[f"{r[c]:.3f} / {measured.get((r['load'], int(c[11:]))):.3f}"
                                                  for c in replay_columns]] for _, r in mine.iterrows()]) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", help="a sweep directory (or any directory of runs)")
    parser.add_argument("--replay", action="store_true", help="complete the replay with one draft forward a request")
    args = parser.parse_args(argv)
    print_tables(args.runs, args.replay)


if __name__ == "__main__":
    main()
