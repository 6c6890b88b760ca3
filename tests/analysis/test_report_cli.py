"""``python -m specexp report`` on any runs, through the CLI: a mixed directory of single runs, a sweep and
a backend comparison; several directories at once; globs; symlinked run and sweep directories; broken
records listed as skipped; bad paths refused in one line. The runs are real (tiny random pair, 2 prompts,
a few new tokens, W&B disabled), made once for the module."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specexp.analysis.groups import MAX_LABEL_CHARS
from specexp.analysis.plots import FIGURES

ROOT = Path(__file__).resolve().parents[2]
TINY = ["pair=tiny_random", "tracking=disabled", "workload.num_prompts=2"]


def _specexp(*args: str, runs_dir: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    if runs_dir is not None:
        env["SPECEXP_RUNS_DIR"] = str(runs_dir)
    return subprocess.run([sys.executable, "-m", "specexp", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=ROOT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sweep_dir) -> Path:
    """A runs directory holding a depth sweep (k = 0, 1, 2), a single run (k = 2) and a backend comparison
    (native and hf at k = 2) of the tiny random pair."""
    root = tmp_path_factory.mktemp("report-runs")
    shutil.copytree(sweep_dir, root / sweep_dir.name)
    single = _specexp("run", "+exp=quickstart", *TINY, "workload=random", "workload.input_len=8",
                      "workload.output_len=4", "speculator.num_speculative_tokens=2", runs_dir=root)
    assert single.returncode == 0, single.stderr[-3000:]
    compare = _specexp("run", "-m", "+exp=backend_compare", *TINY, "engine=cpu", "backend=native,hf",
                       "workload.input_len=16", "sampling.max_new_tokens=4", "speculator.num_speculative_tokens=2",
                       "isolate_sweep_jobs=false", runs_dir=root)
    assert compare.returncode == 0, compare.stderr[-3000:]
    return root


def _one(runs: Path, prefix: str) -> Path:
    (path,) = runs.glob(f"{prefix}_*")
    return path


def _groups(report_md: Path) -> list[dict]:
    """The rows of report.md's group table as dicts (header -> cell)."""
    section = report_md.read_text().split("## Groups")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in rows[0].strip("|").split(" | ")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split(" | ")))) for row in rows[1:]]


def _lines(stderr: str) -> list[str]:
    """stderr's lines but the noise warning, which depends on how busy the machine was when the runs ran."""
    return [line for line in stderr.strip().splitlines() if "flagged their timings noisy" not in line]


def _ok_report(*args: str) -> subprocess.CompletedProcess:
    done = _specexp("report", *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done


def test_a_mixed_directory_of_single_runs_a_sweep_and_a_backend_comparison_renders(runs, tmp_path):
    out = tmp_path / "report"
    done = _ok_report(str(runs), "--out", str(out))
    assert not [line for line in _lines(done.stderr) if "specexp:" in line]  # nothing skipped, every figure drawn
    assert {p.stem for p in out.glob("*.png")} == set(FIGURES)
    groups = _groups(out / "report.md")
    assert len(groups) == 4  # the sweep, the single run, native and hf
    assert sorted(g["backend"] for g in groups) == ["hf", "native", "native", "native"]
    assert {g["sweep"].split("_2")[0] for g in groups} == {"depth_sweep", "single runs", "backend_compare"}
    for group in groups:
        assert len(group["group"]) <= MAX_LABEL_CHARS
        assert group["pair"] == "tiny_random" and group["device"] == "cpu" and group["workload"] in ("random", "code")
        assert group["what differs"]
    assert len({g["group"] for g in groups}) == 4
    text = (out / "report.md").read_text()
    assert "## Not drawn" not in text and "## Skipped" not in text
    assert "6 runs (6 ok) in 4 comparison groups" in text


def test_two_directories_at_once(runs, tmp_path):
    out = tmp_path / "report"
    sweep, compare = _one(runs, "depth_sweep"), _one(runs, "backend_compare")
    _ok_report(str(sweep), str(compare), "--out", str(out))
    groups = _groups(out / "report.md")
    assert sorted(g["backend"] for g in groups) == ["hf", "native", "native"]
    assert f"`{sweep}`, `{compare}`" in (out / "report.md").read_text()


def test_a_glob_selects_the_runs_it_matches(runs, tmp_path):
    out = tmp_path / "report"
    _ok_report(f"{runs}/backend_compare_*", "--out", str(out))
    groups = _groups(out / "report.md")
    assert sorted(g["group"] for g in groups) == ["hf", "native"]


def test_symlinked_run_and_sweep_directories_are_followed(runs, tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    (links / "sweep").symlink_to(_one(runs, "depth_sweep"), target_is_directory=True)
    (links / "single").symlink_to(_one(runs, "quickstart"), target_is_directory=True)
    (links / "loop").symlink_to(links, target_is_directory=True)  # a cycle must not hang the search
    _ok_report(str(links))  # one directory: the report goes into it
    groups = _groups(links / "report.md")
    assert sorted(g["sweep"].split("_2")[0] for g in groups) == ["depth_sweep", "single runs"]
    assert sum(int(g["ok/runs"].split("/")[1]) for g in groups) == 4


def test_broken_records_are_listed_as_skipped_in_one_line_each(runs, tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(_one(runs, "depth_sweep"), copy / "sweep")
    cut = copy / "cut"
    cut.mkdir()
    text = (copy / "sweep" / "0" / "result.json").read_text()
    (cut / "result.json").write_text(text[: len(text) // 2])
    (copy / "other").mkdir()
    (copy / "other" / "result.json").write_text('{"hello": 1}')
    done = _ok_report(str(copy), "--out", str(tmp_path / "report"))
    skipped = [line for line in done.stderr.splitlines() if line.startswith("specexp: skipped")]
    assert len(skipped) == 2 and len(_lines(done.stderr)) == 2
    assert any(str(cut) in line and "not valid JSON" in line for line in skipped)
    assert any("no 'status'" in line for line in skipped)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Skipped run directories" in text and str(cut) in text
    assert "3 runs (3 ok)" in text


@pytest.mark.parametrize("make_args, message", [
    (lambda tmp: [str(tmp / "missing")], "no such file or directory: {tmp}/missing"),
    (lambda tmp: [f"{tmp}/nothing_*"], "no such file or directory: {tmp}/nothing_*"),
    (lambda tmp: [str(tmp), str(tmp)], "2 paths given: pass --out DIR"),
    (lambda tmp: [], "report needs"),
])
def test_bad_paths_are_refused_in_one_line(tmp_path, make_args, message):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "result.json").write_text("{}")
    done = _specexp("report", *make_args(tmp_path))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specexp: error: ")
    assert message.format(tmp=tmp_path) in lines[0]


def test_a_directory_of_unreadable_records_is_refused_in_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "result.json").write_text("{")
    done = _specexp("report", str(tmp_path))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "no usable runs" in line and "not valid JSON" in line


def test_a_directory_of_failed_runs_is_reported_with_their_errors(tmp_path):
    import json

    for k in (0, 2):
        (tmp_path / "runs" / str(k)).mkdir(parents=True)
        record = {"status": "failed", "error": f"RuntimeError: out of memory at k={k}",
                  "config": {"pair": {"name": "tiny_random"}, "speculator": {"num_speculative_tokens": k}},
                  "metrics": {}}
        (tmp_path / "runs" / str(k) / "result.json").write_text(json.dumps(record))
    done = _ok_report(str(tmp_path / "runs"))
    assert done.stderr == ""
    text = (tmp_path / "runs" / "report.md").read_text()
    assert "2 runs (0 ok)" in text and "out of memory at k=2" in text.split("## Runs that did not finish")[1]
