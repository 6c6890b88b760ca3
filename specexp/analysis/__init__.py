"""Analysis of run records: load runs as a tidy DataFrame, derive per-position acceptance, speedup over
k=0 and Leviathan's theory fit, and draw the figures of the notebooks and ``python -m specexp report``.

    from specexp.analysis import load_runs, per_position, speedup, fit_theory, plots
    runs = load_runs("experiments/runs")          # one row per run (result.json is the source of truth)
    plots.acceptance_vs_k(runs)                   # a matplotlib Figure
    group_table(with_groups(runs))                # what each group label in the figures stands for

Depends on pandas and matplotlib only (wandb is optional, for online runs).
"""

from specexp.analysis.groups import group_table, with_groups
from specexp.analysis.load import find_run_dirs, load_runs, load_sweep, runs_dir, select_sweep
from specexp.analysis.metrics import graph_capture, per_position, per_request, speedup, step_breakdown
from specexp.analysis.report import summary_table
from specexp.analysis.theory import (
    best_k,
    expected_acceptance_length,
    expected_speedup,
    fit_theory,
    theory_curve,
    with_theory,
)

__all__ = [
    "best_k", "expected_acceptance_length", "expected_speedup", "find_run_dirs", "fit_theory", "graph_capture",
    "group_table",
    "load_runs", "load_sweep", "per_position", "per_request", "runs_dir", "select_sweep", "speedup", "step_breakdown", "summary_table",
    "theory_curve", "with_groups", "with_theory",
]
