"""The reports under experiments/: every table is what its listed command prints from the committed JSON,
every figure has a command that draws it, every file is named in its README, and each README fits in 150 lines."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORTS = sorted(p.parent for p in (ROOT / "experiments").glob("*/README.md"))
# the scripts whose printed tables the reports paste (figure scripts are checked separately)
TABLE_SCRIPTS = ("benchmarks/cudagraphs_report.py", "benchmarks/backends_report.py",
                 "benchmarks/native_vs_hf.py", "benchmarks/acceptance_replay.py", "benchmarks/load_report.py",
                 "benchmarks/load_gpu_report.py", "benchmarks/sweep_time.py", "benchmarks/dynamic_depth_report.py",
                 "benchmarks/diagnostics/goodput_replay.py", "benchmarks/diagnostics/kernel_cuts.py",
                 "benchmarks/diagnostics/skinny_alternatives.py", "benchmarks/diagnostics/tune_skinny.py",
                 "benchmarks/diagnostics/attention_context.py", "benchmarks/diagnostics/reuse_cost.py",
                 "benchmarks/diagnostics/head_norm_fusion.py")
# the scripts that draw a report's figures: `python SCRIPT NAME OUT.png ...`
FIGURE_SCRIPTS = ("benchmarks/cudagraphs_figures.py", "benchmarks/load_figures.py", "benchmarks/dynamic_depth_report.py",
                  "benchmarks/load_gpu_report.py")
# how a file was produced, not what it holds: s9, lease4, ... ([e] keeps the words themselves out of the source)
PRODUCTION_WORDS = re.compile(r"(^|[_.-])(s\d+|l[e]ase\d*|s[e]ssion\d*|l[e]nt)([_.-]|$)", re.IGNORECASE)


def _commands(readme: Path) -> list[tuple[list[str], list[str]]]:
    """(argv with $D set to the report folder, the README lines after it up to the next command or section
    heading) for every indented `python benchmarks/...` line of the README."""
    lines = readme.read_text().splitlines()
    folder = str(readme.parent.relative_to(ROOT))
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("    python benchmarks/"):
            continue
        argv = shlex.split(line.replace("$D", folder), comments=True)[1:]
        block = []
        for following in lines[i + 1:]:
            if following.startswith(("    python ", "# ", "## ")):  # a printed table may carry ### headings
                break
            block.append(following)
        out.append((argv, block))
    return out


def _tables(block: list[str]) -> list[list[str]]:
    """The markdown tables (maximal runs of lines starting with '|') of a block of lines."""
    tables, current = [], []
    for line in [*block, ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def _run(argv: list[str]) -> str:
    """What `python argv...` prints, run in this process from the repository root."""
    out = io.StringIO()
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = argv
    try:
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(out):
            runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    return out.getvalue()


def _table_commands():
    for report in REPORTS:
        for argv, block in _commands(report / "README.md"):
            if argv[0] in TABLE_SCRIPTS and _tables(block):
                yield pytest.param(argv, _tables(block), id=f"{report.name}:{' '.join(argv[:2])}")


@pytest.mark.parametrize(("argv", "tables"), list(_table_commands()))
def test_every_table_is_what_its_command_prints(argv, tables):
    printed = _run(argv).splitlines()
    for table in tables:
        starts = [i for i, line in enumerate(printed) if line == table[0]]
        assert starts, f"{' '.join(argv)} prints no table headed {table[0][:80]!r}"
        assert any(printed[i:i + len(table)] == table for i in starts), (
            f"{' '.join(argv)}: the README's table headed {table[0][:60]!r} differs from the printed one")


def test_table_commands_cover_every_cudagraphs_table():
    """Each table of the CUDA-graph report except the hand-made change → effect table comes from a command."""
    readme = ROOT / "experiments" / "2026-11-29-cudagraphs-h200" / "README.md"
    generated = {tuple(t) for argv, block in _commands(readme) for t in _tables(block)}
    made_by_hand = [t for t in _tables(readme.read_text().splitlines()) if tuple(t) not in generated]
    assert [t[0] for t in made_by_hand] == ["| change (commit) | effect | before → after |"]


@pytest.mark.parametrize("report", REPORTS, ids=[r.name for r in REPORTS])
def test_every_figure_has_a_command_that_draws_it(report, tmp_path):
    readme = (report / "README.md").read_text()
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    for figure in figures:
        assert (report / figure).is_file(), f"{report.name}: {figure} is not in the folder"
    drawn = {}
    for argv, _ in _commands(report / "README.md"):
        if argv[0] in FIGURE_SCRIPTS and argv[2].endswith(".png"):  # a script may print tables too
            drawn[Path(argv[2]).name] = argv
    if "specexp report" in readme:  # the CLI's report draws its figures (tested with specexp.analysis)
        return
    assert sorted(drawn) == sorted(figures), f"{report.name}: figures without a command, or commands without one"
    for name, argv in drawn.items():
        out = tmp_path / name
        _run([*argv[:2], str(out), *argv[3:]])
        assert out.stat().st_size > 10_000, f"{name}: the command drew a near-empty PNG"


@pytest.mark.parametrize("report", REPORTS, ids=[r.name for r in REPORTS])
def test_every_file_of_a_report_is_named_in_its_readme(report):
    readme = (report / "README.md").read_text()
    patterns = [p for p in re.findall(r"`([^`\s]+)`", readme) if "*" in p]
    unnamed = [entry.name for entry in sorted(report.iterdir()) if entry.name != "README.md"
               and entry.name not in readme and entry.stem not in readme
               and not any(fnmatch.fnmatch(name, Path(p).name) for p in patterns for name in (entry.name, entry.stem))]
    assert not unnamed, f"{report.name}: files no table or figure names: {unnamed}"


@pytest.mark.parametrize("report", REPORTS, ids=[r.name for r in REPORTS])
def test_report_readme_fits_in_150_lines(report):
    assert len((report / "README.md").read_text().splitlines()) <= 150


def test_report_file_names_say_what_they_hold():
    """No name under experiments/ or benchmarks/ carries a suffix of how it was produced (s9, lease4, ...)."""
    names = [p for d in ("experiments", "benchmarks") for p in (ROOT / d).rglob("*")
             if "runs" not in p.relative_to(ROOT).parts]
    assert [str(p.relative_to(ROOT)) for p in names if PRODUCTION_WORDS.search(p.stem)] == []
