"""Progress of a run on the console: plain lines in a log, a bar on a terminal, nothing when switched off."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from specexp.backends import get_backend, run_backend
from specexp.cli import compose_config
from specexp.engine.progress import CAPTURE, COMPILING, RUN, ProgressEvent
from specexp.errors import ConfigError
from specexp.experiment import RunContext, build_run_spec
from specexp.progress import (
    ProgressDisplay,
    console_progress,
    format_line,
    progress_interval_s,
    progress_mode,
)

RUN_LINE = re.compile(r"^specexp: run (\d+)/(\d+) requests \(\d+%\), (\d+) output tokens, [\d.]+ tokens/s, "
                      r"elapsed \d+:\d\d:\d\d, ETA (\?|\d+:\d\d:\d\d)$")


def _run_lines(text: str) -> list[tuple[int, int, int]]:
    """(done, total, output tokens) of each run line in `text`."""
    found = [RUN_LINE.match(line) for line in text.splitlines() if line.startswith("specexp: run ")]
    assert all(found), text
    return [(int(m[1]), int(m[2]), int(m[3])) for m in found]


def test_lines_print_at_the_start_every_interval_and_at_the_end():
    out = io.StringIO()
    display = ProgressDisplay("lines", out, interval_s=10.0)
    for done, elapsed in [(0, 0.0), (1, 4.0), (2, 9.9), (3, 10.0), (4, 15.0), (5, 25.0), (6, 26.0), (8, 27.0)]:
        display(ProgressEvent(RUN, done, 8, elapsed, output_tokens=10 * done))
    assert [done for done, _, _ in _run_lines(out.getvalue())] == [0, 3, 5, 8]
    assert out.getvalue().splitlines()[-1].startswith("specexp: run 8/8 requests (100%), 80 output tokens, 3.0 ")


def test_a_line_says_the_rate_and_an_eta_from_the_finished_requests():
    line = format_line(ProgressEvent(RUN, 120, 480, 30.0, output_tokens=15000))
    assert line == ("specexp: run 120/480 requests (25%), 15000 output tokens, 500.0 tokens/s, elapsed 0:00:30, "
                    "ETA 0:01:30")
    assert format_line(ProgressEvent(RUN, 0, 4, 2.0)).endswith("ETA ?")
    assert format_line(ProgressEvent(CAPTURE, 10, 40, 5.0, label="x")) == (
        "specexp: capturing CUDA graphs 10/40 graphs (25%), elapsed 0:00:05, ETA 0:00:15")
    assert format_line(ProgressEvent(CAPTURE, 1, 3, 5.0, activity=COMPILING)).startswith(
        "specexp: compiling CPU step graphs 1/3 graphs (33%)")


def test_a_new_phase_or_a_new_run_starts_its_own_lines():
    out = io.StringIO()
    display = ProgressDisplay("lines", out, interval_s=1e9)
    events = [ProgressEvent(CAPTURE, 0, 2, 0.0), ProgressEvent(CAPTURE, 1, 2, 0.1, label="a"),
              ProgressEvent(CAPTURE, 2, 2, 0.2, label="b"), ProgressEvent(RUN, 0, 3, 0.0),
              ProgressEvent(RUN, 2, 3, 1.0, 5), ProgressEvent(RUN, 0, 3, 0.0), ProgressEvent(RUN, 3, 3, 1.0, 9)]
    for event in events:
        display(event)
    lines = out.getvalue().splitlines()
    assert [line.split(" ")[1] for line in lines] == ["capturing", "capturing", "run", "run", "run"]
    assert _run_lines(out.getvalue()) == [(0, 3, 0), (0, 3, 0), (3, 3, 9)]


def test_the_bar_draws_requests_and_tokens_per_second_and_closes_at_the_end():
    out = io.StringIO()
    with console_progress({"SPECEXP_PROGRESS": "bar"}, stream=out) as progress:
        assert isinstance(progress, ProgressDisplay) and progress.mode == "bar"
        for done in range(5):
            progress(ProgressEvent(RUN, done, 4, 0.5 * (done + 1), output_tokens=7 * done))
        assert progress._bar is None, "done == total closes the bar"
    text = out.getvalue()
    assert "requests" in text and "4/4" in text and "tok/s" in text


def test_a_bar_left_open_by_a_failed_run_is_closed():
    out = io.StringIO()
    with pytest.raises(RuntimeError), console_progress({"SPECEXP_PROGRESS": "bar"}, stream=out) as progress:
        progress(ProgressEvent(RUN, 1, 4, 1.0, 3))
        raise RuntimeError("the backend failed")
    assert progress._bar is None


@pytest.mark.parametrize("value,mode", [(None, "auto"), ("", "auto"), ("auto", "auto"), ("BAR", "bar"),
                                        ("lines", "lines"), ("off", "off"), ("0", "off"), ("false", "off")])
def test_the_switch_reads_specexp_progress(value, mode):
    assert progress_mode({} if value is None else {"SPECEXP_PROGRESS": value}) == mode


def test_a_bad_switch_or_interval_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"SPECEXP_PROGRESS='loud' is not valid: use one of auto, bar, lines, off"):
        progress_mode({"SPECEXP_PROGRESS": "loud"})
    with pytest.raises(ConfigError, match=r"SPECEXP_PROGRESS_INTERVAL_S='-1' is not valid"):
        progress_interval_s({"SPECEXP_PROGRESS_INTERVAL_S": "-1"})
    assert progress_interval_s({}) == 10.0 and progress_interval_s({"SPECEXP_PROGRESS_INTERVAL_S": "2.5"}) == 2.5


def test_auto_draws_lines_where_stderr_is_no_terminal_and_off_draws_nothing():
    with console_progress({}, stream=io.StringIO()) as progress:
        assert progress.mode == "lines"
    with console_progress({"SPECEXP_PROGRESS": "off"}, stream=io.StringIO()) as progress:
        assert progress is None


def _spec(tmp_path, target, draft, backend, num_prompts=3):
    overrides = ["pair=local", f"pair.target.path={target}", f"pair.draft.path={draft}", "workload=random",
                 f"workload.num_prompts={num_prompts}", "workload.input_len=5", "workload.output_len=6",
                 "speculator.num_speculative_tokens=2", f"backend={backend}", "tracking=disabled"]
    cfg = OmegaConf.to_container(compose_config(overrides), resolve=True)
    return build_run_spec(cfg, RunContext(run_dir=tmp_path, experiment="test"))


@pytest.mark.parametrize("backend", ["native", "hf"])
def test_backends_report_requests_done_up_to_the_total(tmp_path, tiny_llama_dir, tiny_llama_draft_dir, backend):
    spec = _spec(tmp_path, tiny_llama_dir, tiny_llama_draft_dir, backend)
    events: list[ProgressEvent] = []
    result = run_backend(get_backend(backend), spec, events.append)
    assert events and all(e.phase == RUN and e.total == 3 for e in events)
    assert events[0].done == 0 and events[-1].done == 3
    assert events[-1].output_tokens == sum(len(r.output_token_ids) for r in result.requests) == 18
    assert all(a.done <= b.done and a.output_tokens <= b.output_tokens for a, b in itertools.pairwise(events))
    if backend == "hf":  # one request at a time: an event after each
        assert [e.done for e in events] == [0, 1, 2, 3]


def test_a_backend_whose_run_takes_no_progress_still_runs():
    class Plain:
        @staticmethod
        def run(spec):
            return ("ran", spec)

    assert run_backend(Plain, "spec", progress=print) == ("ran", "spec")


def _cli(tmp_path, *args, **env):
    environ = {**os.environ, "SPECEXP_RUNS_DIR": str(tmp_path / "runs"), **env}
    return subprocess.run([sys.executable, "-m", "specexp", *args], capture_output=True, text=True, env=environ,
                          check=False, timeout=600)


def test_a_run_in_a_log_prints_requests_done_of_total(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    """stderr is a pipe here, as in a log: auto draws plain lines; every event prints at interval 0."""
    pair = ["pair=local", f"pair.target.path={tiny_llama_dir}", f"pair.draft.path={tiny_llama_draft_dir}",
            "workload=random", "workload.num_prompts=3", "workload.input_len=5", "workload.output_len=6",
            "speculator.num_speculative_tokens=2", "engine.max_num_seqs=1", "tracking=disabled"]
    proc = _cli(tmp_path, "run", *pair, f"hydra.run.dir={tmp_path / 'run'}", SPECEXP_PROGRESS_INTERVAL_S="0")
    assert proc.returncode == 0, proc.stderr
    lines = _run_lines(proc.stderr)
    done = [d for d, _, _ in lines]
    assert sorted(set(done)) == [0, 1, 2, 3] and done == sorted(done) and {total for _, total, _ in lines} == {3}
    assert lines[-1][2] == json.loads((tmp_path / "run" / "result.json").read_text())["metrics"]["num_output_tokens"]


def test_a_bad_switch_stops_the_run_with_one_line(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    proc = _cli(tmp_path, "run", "pair=local", f"pair.target.path={tiny_llama_dir}",
                f"pair.draft.path={tiny_llama_draft_dir}", "workload=random", "workload.num_prompts=1",
                "tracking=disabled", f"hydra.run.dir={tmp_path / 'run'}", SPECEXP_PROGRESS="loud")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "specexp: error: SPECEXP_PROGRESS='loud' is not valid: use one of auto, bar, lines, off")
