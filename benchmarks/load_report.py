"""Tables of a serving-load sweep (`+exp=load_sweep` / `+exp=rate_sweep`) from its run records, as markdown:

    python benchmarks/load_report.py RUNS [--replay] [--out DIR]

RUNS: a sweep directory (or any directory of runs). Prints how the runs were measured (repeats, their order,
warm-up, the machine's CPU count and the 1-minute load averages read around every repeat, the runs whose
timings the noise guards flagged), then per series: output tokens/s, TPOT, tokens/s per user and the verify
share by load and k, each as mean ± std over the repeats with n, tokens/s also with its 95% t interval; the
mean batch (a count); the fastest k at each load with its speedup's 95% interval from the repeats of both
points and whether the runner-up is inside it; and the oracle table (measured best vs the best static k
modelled on the deepest run's steps vs the per-step hindsight oracle; the modelled ones once per repeat's
step costs, mean ± std). A cell marked † comes from a run whose record flags its timings noisy.
`--replay` completes the deepest run's unobserved draft positions with one draft forward a request (the
trained pair's checkpoints, `specexp.analysis.acceptance_replay.load_pair`), so the replayed acceptance of
every k is exact; it prints that next to what each k measured. `--out DIR` also writes what it prints to
DIR/load_report.md and every table, with every interval, to DIR/load_report.json.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specexp.analysis import load_runs
from specexp.analysis.load_tables import (
    SERIES,
    best_k_table,
    load_table,
    measurement_summary,
    oracle_table,
)

NOISY = "†"
# (column, title, digits): the timing tables, each cell mean ± std over the repeats.
TIMING_TABLES = (("tpot_ms.p50", "TPOT p50 (ms)", 1), ("tpot_ms.p99", "TPOT p99 (ms)", 1),
                 ("tokens_per_s_per_user.p50", "Tokens/s per user (1000 / TPOT, p50)", 0),
                 ("verify_share.mean", "Verify share of step time (mean)", 2))


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value, digits: int = 1) -> str:
    if _missing(value):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def spread_cell(row, column: str, digits: int, interval: bool = False, show_n: bool = False) -> str:
    """``206 ± 12`` (``[176, 236]`` with ``interval``, `` n=2`` with ``show_n``, † when the run was flagged)."""
    mean = row.get(column)
    if _missing(mean):
        return "–"
    text = _fmt(float(mean), digits)
    if not _missing(row.get(f"{column}_std")):
        text += f" ± {row[f'{column}_std']:.{digits}f}"
    if interval and not _missing(row.get(f"{column}_low")):
        text += f" [{row[f'{column}_low']:.{digits}f}, {row[f'{column}_high']:.{digits}f}]"
    if show_n:
        text += f" n={int(row.get(f'{column}_n') or 0)}"
    return text + (NOISY if row.get("noisy") else "")


def repeats_note(table, column: str) -> tuple[str, bool]:
    """("n = 3 repeats in every cell", False) when every run has as many repeats of ``column``, else ("n in
    each cell", True)."""
    counts = {int(n) for n in table[f"{column}_n"].dropna()} if f"{column}_n" in table else set()
    if len(counts) == 1:
        (n,) = counts
        return f"n = {n} repeat{'s' * (n != 1)} in every cell", False
    return "n in each cell", True


def pivot_table(table, column: str, digits: int, interval: bool = False) -> tuple[str, str]:
    """(markdown, its n note): loads down, k across, ``column`` of each run as mean ± std over its repeats
    (a count column, e.g. the mean batch, as its value)."""
    ks = sorted(int(k) for k in table["k"].unique())
    timed = f"{column}_std" in table
    note, show_n = repeats_note(table, column) if timed else ("", False)
    rows = []
    for load, group in table.groupby("load", sort=True):
        by_k = {int(r["k"]): r for _, r in group.iterrows()}
        cells = [(spread_cell(by_k[k], column, digits, interval, show_n) if timed else _fmt(by_k[k][column], digits))
                 if k in by_k else "–" for k in ks]
        rows.append([f"{load:g}", *cells])
    return _markdown(["load", *[f"k={k}" for k in ks]], rows), note


def _interval(low, high, digits: int = 2) -> str:
    return "" if _missing(low) or _missing(high) else f" [{low:.{digits}f}, {high:.{digits}f}]"


def _seconds(iso_time: str | None) -> str:
    """``2026-12-02T15:43:48`` of ``2026-12-02T15:43:48.398`` ("–" when unknown)."""
    return iso_time.split(".")[0] if iso_time else "–"


def measurement_text(summary: dict) -> str:
    """The "How these runs were measured" lines of :func:`measurement_summary`."""
    loads = summary["load_avg_1m"]
    runs = (f"- {summary['num_runs']} runs, {summary['repeats']} measured repeat(s) each ({summary['order']}), "
            f"{summary['warmup_requests']} warm-up request(s) per run; repeats started "
            f"{_seconds(summary['first_started_at'])} .. {_seconds(summary['last_started_at'])}, "
            f"{summary['measured_s']:.0f} s measured in all.")
    machine = (f"- Machine: {summary['cpu_count']} CPUs (`os.cpu_count()`); 1-minute load average over "
               f"{loads['n']} readings (before the first repeat and after each): min {_fmt(loads['min'], 2)}, "
               f"median {_fmt(loads['median'], 2)}, max {_fmt(loads['max'], 2)}.")
    guards = (f"- Noise guards: {summary['busy_runs']} of {summary['num_runs']} runs saw the machine busy "
              f"(1-min load > {summary['busy_load_per_core']} x CPUs), {summary['disagree_runs']} had repeats whose "
              f"figures disagree (relative std > {summary['max_relative_std']:.0%}); their timings are marked "
              f"{NOISY}.")
    lines = [runs, machine, guards]
    return "\n".join(lines)


def print_tables(runs_dir: str, replay: bool, out: Path | None = None) -> dict:
    """Print the tables of the runs under ``runs_dir`` (module docstring); returns them as JSON-ready dicts
    (and writes load_report.md / load_report.json into ``out`` when given)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_runs(runs_dir, status="ok")
    if runs.empty:
        print(f"load_report: no finished runs under {runs_dir!r}: give a sweep directory of `+exp=load_sweep`",
              file=sys.stderr)
        raise SystemExit(2)
    table = load_table(runs)
    draft_pair = None
    if replay:
        from specexp.analysis.acceptance_replay import load_pair

        draft_pair = load_pair(runs["pair.target.path"].iloc[0], runs["pair.draft.path"].iloc[0])
    oracle = oracle_table(runs, draft_pair)
    best = best_k_table(runs)
    summary = measurement_summary(runs)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _print(table, best, oracle, summary)
    sys.stdout.write(printed.getvalue())
    tables = {"measurement": summary, "load": _records(table), "best_k": _records(best), "oracle": _records(oracle)}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "load_report.md").write_text(printed.getvalue())
        (out / "load_report.json").write_text(json.dumps(tables, indent=1, allow_nan=False) + "\n")
    return tables


def _print(table, best, oracle, summary: dict) -> None:
    print("How these runs were measured\n")
    print(measurement_text(summary) + "\n")
    for series, rows in table.groupby(SERIES, sort=True):
        print(f"### {series}\n")
        markdown, note = pivot_table(rows, "output_tokens_per_s", 0, interval=True)
        print(f"Output tokens/s: mean ± std [95% t interval], {note}\n\n{markdown}\n")
        for column, title, digits in TIMING_TABLES:
            markdown, note = pivot_table(rows, column, digits)
            print(f"{title}: mean ± std, {note}\n\n{markdown}\n")
        markdown, _ = pivot_table(rows, "num_reqs_per_step.mean", 1)
        spread = rows["num_reqs_per_step.mean_spread"].max()
        same = ("the same in every repeat of each run" if spread == 0 else
                f"the first repeat's; repeats differ by up to {spread:.1f}")
        print(f"Mean batch (requests per step, a count: {same})\n\n{markdown}\n")
        mine = best[best[SERIES] == series]
        print("Fastest k per load (speedup [95% from the repeats of both points]; n = repeats at that k / at k=0)\n")
        print(_markdown(["load", "fastest k", "its tokens/s", "k=0 tokens/s", "speedup", "n", "runner-up"],
                        [[f"{r.load:g}", r.best_k, _fmt(r.output_tokens_per_s, 0), _fmt(r.output_tokens_per_s_k0, 0),
                          _fmt(r.speedup, 2) + _interval(r.speedup_low, r.speedup_high) + (NOISY if r.noisy else ""),
                          f"{r.repeats}/{r.baseline_repeats}", r.claim.split("; ", 1)[-1] if "; " in r.claim else "–"]
                         for r in mine.itertuples()]) + "\n")
        if oracle.empty:
            continue
        mine = oracle[oracle[SERIES] == series]
        print("Oracle vs best static vs measured (speedup over k = 0: measured [95% from the repeats of both "
              "points]; modelled and oracle mean ± std over the repeats' step costs, n = repeats)\n")
        print(_markdown(["load", "measured best k", "measured", "modelled best static k", "modelled",
                         "per-step oracle", "oracle mean k", "n"],
                        [[f"{r.load:g}", r.measured_best_k,
                          _fmt(r.measured_speedup, 2) + _interval(r.measured_speedup_low, r.measured_speedup_high),
                          r.model_best_static_k, _pm(r.model_best_static_speedup, r.model_best_static_speedup_std),
                          _pm(r.oracle_speedup, r.oracle_speedup_std), _pm(r.oracle_k_mean, r.oracle_k_mean_std),
                          int(r.oracle_speedup_n)]
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


def _pm(mean, std, digits: int = 2) -> str:
    return _fmt(mean, digits) + ("" if _missing(std) else f" ± {std:.{digits}f}")


def _records(frame) -> list[dict]:
    """A frame's rows as JSON-ready dicts (NaN -> null, numpy scalars and lists -> Python)."""
    def plain(value):
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, float) and math.isnan(value):
            return None
        return value

    return [{str(k): plain(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", help="a sweep directory (or any directory of runs)")
    parser.add_argument("--replay", action="store_true", help="complete the replay with one draft forward a request")
    parser.add_argument("--out", type=Path, help="also write load_report.md and load_report.json here")
    args = parser.parse_args(argv)
    print_tables(args.runs, args.replay, args.out)


if __name__ == "__main__":
    main()
