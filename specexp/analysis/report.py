"""``python -m specexp report SWEEP_DIR [--out DIR]``: the figures of :data:`specexp.analysis.plots.FIGURES`
as PNG files plus ``report.md`` (a summary table per run, the theory fit per group) and ``summary.csv``,
written into SWEEP_DIR (or ``--out``). SWEEP_DIR may hold one sweep or several (any directory tree of run
directories with a result.json each).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from specexp.analysis import tasks
from specexp.analysis.load import load_runs
from specexp.analysis.theory import _column, fit_theory, with_theory

REPORT_FILE = "report.md"
SUMMARY_FILE = "summary.csv"
MIB = 1024 ** 2
SPEEDUP_NOTE = (
    "Speedup = output tokens/s ÷ the k=0 run of the same group. Theory: Leviathan et al. with α fitted to the "
    "per-position counts and c = draft forward ÷ target decode step (see `specexp.analysis.theory`)."
)
SUMMARY_COLUMNS = {
    "group": "group",
    "k": "k",
    "acceptance_length": "acceptance length",
    "theory_acceptance_length": "theory AL",
    "per_position": "per-position acceptance",
    "output_tokens_per_s": "tokens/s",
    "speedup": "speedup",
    "theory_speedup": "theory speedup",
    "tpot_ms.p50": "TPOT p50 (ms)",
    "graph_memory_mib": "graph memory (MiB)",
}


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _positions(values) -> str:
    if not isinstance(values, (list, tuple)) or not values:
        return "–"
    return " ".join(_fmt(v) for v in values)


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per finished run with the columns of :data:`SUMMARY_COLUMNS` (numbers, unformatted)."""
    runs = with_theory(df)
    if runs.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    runs["per_position"] = runs.get("per_position_acceptance")
    runs["graph_memory_mib"] = _column(runs, "graph_capture_bytes") / MIB
    table = runs[[c for c in SUMMARY_COLUMNS if c in runs]].sort_values(["group", "k"], kind="stable")
    return table.reset_index(drop=True)


def markdown_table(rows: list[list[str]], header: list[str]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def summary_markdown(table: pd.DataFrame) -> str:
    """:func:`summary_table` as markdown ("–" for values not measured, e.g. graph memory on CPU)."""
    rows = []
    for _, row in table.iterrows():
        cells = []
        for column in table.columns:
            value = row[column]
            if column == "per_position":
                cells.append(_positions(value))
            elif column == "output_tokens_per_s":
                cells.append(_fmt(value, 1))
            elif column == "k":
                cells.append(str(int(value)))
            else:
                cells.append(_fmt(value))
        rows.append(cells)
    return markdown_table(rows, [SUMMARY_COLUMNS[c] for c in table.columns])


def pivot_markdown(table: pd.DataFrame, value: str, digits: int = 2) -> str:
    """``value`` of :func:`summary_table` as a group x k markdown table (one row per group)."""
    wide = table.pivot_table(index="group", columns="k", values=value, aggfunc="first", sort=False)
    rows = [[str(group), *(_fmt(float(v), digits) for v in wide.loc[group])] for group in wide.index]
    return markdown_table(rows, ["group", *(f"k={int(k)}" for k in wide.columns)])


def theory_markdown(fits: pd.DataFrame) -> str:
    """The fitted α and c per group, with the best k by theory and as measured."""
    rows = [[str(f["group"]), _fmt(f["alpha"], 3), str(f["alpha_trials"]), _fmt(f["c"], 3),
             _fmt(f["target_step_ms"]), _fmt(f["draft_forward_ms"]), _fmt(f["best_k_theory"]),
             _fmt(f["best_speedup_theory"]), _fmt(f["best_k_measured"]), _fmt(f["best_speedup_measured"])]
            for _, f in fits.iterrows()]
    header = ["group", "α", "trials", "c", "target step (ms)", "draft forward (ms)", "best k (theory)",
              "speedup there", "best k (measured)", "speedup there"]
    return markdown_table(rows, header)


def write_figures(df: pd.DataFrame, out: Path) -> list[Path]:
    """Every figure of :data:`FIGURES` as ``out/<name>.png``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specexp.analysis.plots import FIGURES

    paths = []
    for name, make in FIGURES.items():
        fig = make(df)
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(sweep_dir: str | Path, out: str | Path | None = None) -> Path:
    """Load the runs under ``sweep_dir`` and write figures, report.md and summary.csv into ``out``
    (default ``sweep_dir``). Returns the report.md path. Raises ``FileNotFoundError`` when there are no
    runs."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir} is not a directory: pass a sweep directory (e.g. experiments/runs/depth_sweep_<time>)")
    df = load_runs(sweep_dir)
    if df.empty:
        raise FileNotFoundError(f"no runs (result.json files) under {sweep_dir}")
    out = Path(out) if out is not None else sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    figures = write_figures(df, out)
    table = summary_table(df)
    table.to_csv(out / SUMMARY_FILE, index=False)
    fits = fit_theory(df)
    not_ok = df[df["status"] != "ok"]
    devices = ", ".join(sorted(map(str, df["env.device"].dropna().unique()))) if "env.device" in df else "?"
    lines = [
        f"# Sweep report: {', '.join(sorted(df['sweep_group'].dropna().unique())) or sweep_dir.resolve().name}",
        "",
        f"{len(df)} runs ({len(df) - len(not_ok)} ok) from `{sweep_dir}`; device {devices}.",
        SPEEDUP_NOTE,
        "",
        "## Acceptance length by k",
        "",
        pivot_markdown(table, "acceptance_length"),
        "",
        "## Speedup over k=0 by k",
        "",
        pivot_markdown(table, "speedup"),
        "",
        *tasks.report_section(df, out),
        "## Runs",
        "",
        summary_markdown(table),
        "",
        "## Theory fit",
        "",
        theory_markdown(fits),
        "",
    ]
    if len(not_ok):
        lines += ["## Runs that did not finish", ""]
        lines += [f"- `{r['run_dir']}`: {r['status']} — {r['error']}" for _, r in not_ok.iterrows()]
        lines.append("")
    lines += ["## Figures", ""]
    lines += [f"![{p.stem}]({p.name})" for p in figures]
    path = out / REPORT_FILE
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: str | list[str] | None = None) -> int:
    """Entry point of ``python -m specexp report``; ``argv`` is SWEEP_DIR or the argument list."""
    if isinstance(argv, (str, Path)):
        argv = [str(argv)]
    parser = argparse.ArgumentParser(prog="python -m specexp report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", help="a sweep's output directory (or any directory of runs)")
    parser.add_argument("--out", default=None, help="where to write the report (default: SWEEP_DIR)")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.sweep_dir, args.out)
    except FileNotFoundError as e:
        print(f"specexp: error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
