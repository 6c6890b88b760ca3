"""``python -m specexp report PATH... [--out DIR]``: a report over any runs — single runs, sweeps, backend
comparisons, in any mix. Each PATH is a run directory, a sweep directory, a directory of runs, a
result.json, a symlink to one of these, or a glob (``'experiments/runs/depth_sweep_*'``); symlinked run and
sweep directories inside them are followed.

Writes into DIR (default: the one directory given) the figures of :data:`specexp.analysis.plots.FIGURES` as
PNG files, ``report.md`` (the sections of :data:`specexp.analysis.report_sections.SECTIONS`: the groups and
what each label means, acceptance and speedup by k, a row per run, the theory fit, runs that did not
finish, unusable records) and ``summary.csv``. Runs are grouped by the config keys that differ between
them (:mod:`specexp.analysis.groups`). A result.json that is cut short or is not a run record is listed as
skipped, never fatal; a figure that cannot be drawn is listed with its reason (details in
``report_errors.log``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import pandas as pd

from specexp.analysis.groups import group_table, with_groups
from specexp.analysis.load import RESULT_FILE, expand_paths, read_runs, runs_frame
from specexp.analysis.report_sections import (  # noqa: F401 - summary_table and the helpers are public here too
    SECTIONS,
    Report,
    markdown_table,
    pivot_markdown,
    summary_markdown,
    summary_table,
    theory_markdown,
)
from specexp.analysis.theory import fit_theory

REPORT_FILE = "report.md"
SUMMARY_FILE = "summary.csv"
ERRORS_FILE = "report_errors.log"


DESCRIPTION = """\
Report on any runs: single runs, sweeps, backend comparisons, in any mix. Writes the figures (PNG),
report.md (groups and what each label means, acceptance and speedup by k, a row per run, the theory fit)
and summary.csv. Runs are grouped by the config keys that differ between them; unusable result.json
files are listed as skipped."""
EXAMPLES = """\
examples:
  python -m specexp report experiments/runs/depth_sweep_20261201-120000
  python -m specexp report experiments/runs --out /tmp/all-runs
  python -m specexp report 'experiments/runs/backend_compare_*' experiments/runs/quickstart_20261201-120000 --out /tmp/cmp
  python -m specexp report experiments/runs/depth_sweep_20261201-120000 --acceptance-only
"""


class ReportInputError(ValueError):
    """The paths given to ``report`` cannot be reported on; the message is one line saying why."""


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _expand(sources: list[str | Path]) -> list[Path]:
    """:func:`expand_paths`, refusing paths that do not exist and globs that match nothing."""
    paths, unmatched = expand_paths(sources)
    if unmatched:
        raise ReportInputError(f"no such file or directory: {', '.join(unmatched)} (pass run directories, "
                               "sweep directories, result.json files or globs)")
    return paths


def load_report_runs(sources: list[str | Path]) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """(runs with group columns, skipped) for the report of ``sources`` (paths or globs). Raises
    :class:`ReportInputError` when a path does not exist, a glob matches nothing, or no usable run is
    found."""
    paths = _expand(sources)
    rows, skipped = read_runs(paths)
    if not rows:
        where = ", ".join(map(str, sources))
        if skipped:
            raise ReportInputError(f"no usable runs under {where}: {len(skipped)} result.json files, none readable "
                                   f"(first: {skipped[0][0]}: {skipped[0][1]})")
        raise ReportInputError(f"no runs ({RESULT_FILE} files) under {where}")
    return with_groups(runs_frame(rows)), [(str(d), reason) for d, reason in skipped]


def default_out(sources: list[str | Path]) -> Path:
    """Where the report goes without ``--out``: the one directory given (a run directory for a
    result.json). Raises :class:`ReportInputError` for several paths or globs."""
    paths = _expand(sources)
    if len(paths) == 1:
        path = paths[0]
        return path.parent if path.is_file() else path
    raise ReportInputError(f"{len(paths)} paths given: pass --out DIR to say where the report goes")


def _record_failure(report: Report, out: Path, what: str, error: BaseException) -> None:
    report.failures.append((what, _one_line(error)))
    with (out / ERRORS_FILE).open("a") as log:
        log.write(f"--- {what}\n{''.join(traceback.format_exception(error))}\n")


def write_figures(report: Report, out: Path) -> None:
    """Every figure of :data:`FIGURES` as ``out/<name>.png`` into ``report.figures``; a figure that fails
    is recorded in ``report.failures`` (traceback in ``report_errors.log``) and the others still drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specexp.analysis import depth, tasks
    from specexp.analysis.plots import ACCEPTANCE_FIGURES, FIGURES

    figures = {name: make for name, make in FIGURES.items()
               if not report.acceptance_only or name in ACCEPTANCE_FIGURES}
    if depth.has_dynamic_runs(report.runs) and not report.acceptance_only:  # the modes against the best static k
        figures["dynamic_depth"] = depth.dynamic_depth_figure
    level = tasks.report_level(report.runs)
    if level is not None:  # runs with per-task (or several categories') results: Spec-Bench's layout
        figures[tasks.FIGURE_FILE.removesuffix(".png")] = lambda runs: tasks.acceptance_by_task(runs, level)
    for name, make in figures.items():
        try:
            fig = make(report.runs)
            path = out / f"{name}.png"
            fig.savefig(path, dpi=110)
            report.figures[name] = path
        except Exception as error:  # noqa: BLE001 - one bad figure must not lose the report
            _record_failure(report, out, f"figure {name}", error)
        finally:
            plt.close("all")


def render_markdown(report: Report, out: Path) -> str:
    """report.md: the :data:`SECTIONS` in order (a failing section is listed as not drawn)."""
    parts = []
    for section in SECTIONS:
        try:
            text = section(report)
        except Exception as error:  # noqa: BLE001 - one bad section must not lose the report
            _record_failure(report, out, f"section {section.__name__}", error)
            continue
        if text:
            parts.append(text)
    return "\n\n".join(parts) + "\n"


def write_report(sources: str | Path | list[str | Path], out: str | Path | None = None,
                 acceptance_only: bool = False) -> Path:
    """Load the runs of ``sources`` (a path, a glob or a list of them) and write the figures, report.md
    and summary.csv into ``out`` (default :func:`default_out`). Returns the report.md path. Raises
    :class:`ReportInputError` for paths that cannot be reported on. ``acceptance_only``: leave out every
    timing figure, table column and section (for records whose timings are not fit to quote)."""
    return make_report(sources, out, acceptance_only)[0]


def make_report(sources: str | Path | list[str | Path], out: str | Path | None = None,
                acceptance_only: bool = False) -> tuple[Path, Report]:
    """:func:`write_report`, returning (report.md path, the :class:`Report` it was made from)."""
    sources = [sources] if isinstance(sources, (str, Path)) else list(sources)
    if not sources:
        raise ReportInputError("no paths given: pass run directories, sweep directories or globs")
    out = Path(out) if out is not None else default_out(sources)
    runs, skipped = load_report_runs(sources)
    if out.exists() and not out.is_dir():
        raise ReportInputError(f"--out {out} is a file: pass a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ERRORS_FILE).unlink(missing_ok=True)
    except OSError as e:
        raise ReportInputError(f"cannot write the report into {out}: {e.strerror or e}") from e
    report = Report(runs=runs, table=pd.DataFrame(), fits=pd.DataFrame(), groups=group_table(runs),
                    sources=[str(s) for s in sources], skipped=skipped, acceptance_only=acceptance_only)
    try:
        report.table = summary_table(runs, acceptance_only)
        report.fits = fit_theory(runs)
    except Exception as error:  # noqa: BLE001 - the tables' sections then say nothing; figures still drawn
        _record_failure(report, out, "summary tables", error)
    report.table.to_csv(out / SUMMARY_FILE, index=False)
    write_figures(report, out)
    path = out / REPORT_FILE
    path.write_text(render_markdown(report, out))
    return path, report


def _noisy_runs(report: Report) -> int:
    """How many loaded runs carry a noise flag in their record."""
    if "noise.flags" not in report.runs:
        return 0
    return int(sum(bool(list(f)) for f in report.runs["noise.flags"] if isinstance(f, (list, tuple)) or hasattr(f, "tolist")))


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one ``specexp: error:`` line (exit status 2)."""

    def error(self, message: str):
        self.exit(2, f"specexp: error: report: {message} (see python -m specexp report --help)\n")


def main(argv: str | list[str] | None = None) -> int:
    """Entry point of ``python -m specexp report``; ``argv`` is a path or the argument list. Returns 0
    when the report was written (skipped records and figures that could not be drawn are listed in it and
    on stderr), 2 for bad input."""
    if isinstance(argv, (str, Path)):
        argv = [str(argv)]
    parser = OneLineErrorParser(prog="python -m specexp report", description=DESCRIPTION, epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="run directories, sweep directories, directories of runs, result.json files or globs "
                             "(symlinks followed)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where to write the report (default: the one PATH given; needed for several)")
    parser.add_argument("--acceptance-only", action="store_true",
                        help="leave out every timing figure (tokens/s, latency, speedup, c): for runs measured "
                             "without repeats or on a machine that was not idle")
    args = parser.parse_args(argv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            path, report = make_report(args.paths, args.out, args.acceptance_only)
        except ReportInputError as e:
            print(f"specexp: error: {e}", file=sys.stderr)
            return 2
        except Exception as error:  # noqa: BLE001 - a defect: one line here, the traceback in a file
            log = Path(tempfile.gettempdir()) / f"specexp-{ERRORS_FILE}"
            log.write_text("".join(traceback.format_exception(error)))
            print(f"specexp: error: report failed ({_one_line(error)}); traceback in {log}", file=sys.stderr)
            return 1
    # specexp's own warnings (an unreadable steps.parquet) as one line each; libraries' deprecation notices
    # are not the user's business here.
    ours = [str(w.message).strip().splitlines()[0] for w in caught
            if w.category is UserWarning and "specexp" in Path(w.filename).parts and str(w.message).strip()]
    for message in dict.fromkeys(ours):
        print(f"specexp: warning: {message}", file=sys.stderr)
    noisy = _noisy_runs(report)
    if noisy and not report.acceptance_only:
        print(f"specexp: warning: {noisy} of {len(report.runs)} runs flagged their timings noisy when measured"
              f" (marked † in {path.name}; why: its section Noise)", file=sys.stderr)
    for run_dir, reason in report.skipped:
        print(f"specexp: skipped {run_dir}: {reason}", file=sys.stderr)
    for what, reason in report.failures:
        print(f"specexp: {what} not drawn: {reason} (traceback in {path.parent / ERRORS_FILE})", file=sys.stderr)
    print(f"report: {path} ({len(report.runs)} runs in {len(report.groups)} groups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
