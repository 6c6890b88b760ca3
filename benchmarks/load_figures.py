"""Figures of a serving-load report, the ones notebooks/04_load.ipynb draws (`specexp.analysis.load_plots`):

    python benchmarks/load_figures.py FIGURE OUT.png RUNS

FIGURE: throughput_vs_load, best_k_vs_batch, verify_share_vs_batch, pareto or oracle_vs_static. RUNS: a sweep
directory (or any directory of runs).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specexp.analysis import load_runs
from specexp.analysis.load_plots import FIGURES


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=sorted(FIGURES))
    parser.add_argument("out", type=Path)
    parser.add_argument("runs")
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_runs(args.runs, status="ok")
    fig = FIGURES[args.figure](runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    return args.out


if __name__ == "__main__":
    main()
