"""Run records (docs/design.md §5): result.json for ok, failed and interrupted runs; outputs, steps, answers."""

import json
import sys
import types

import pandas as pd
import pytest
from omegaconf import OmegaConf

from specexp import backends
from specexp.cli import compose_config
from specexp.engine.stats import AcceptanceStats
from specexp.experiment import RunContext, execute
from specexp.result import RequestOutput, RunResult, StepRecord, run_metrics


def fake_result(spec) -> RunResult:
    """Two verification steps per prompt: k drafted, k-1 then k accepted."""
    k = spec.speculator.num_speculative_tokens
    stats, requests, steps = AcceptanceStats(k), [], []
    for prompt in spec.prompts:
        for accepted in (k - 1, k):
            stats.record(prompt.id, k, accepted)
            steps.append(StepRecord(step=len(steps), num_reqs=1, num_tokens=k + 1, num_drafts=1, num_draft_tokens=k,
                                    num_accepted_tokens=accepted, num_output_tokens=accepted + 1, verify_ms=1.0))
        out = list(range(2 * k + 1))
        requests.append(RequestOutput(prompt.id, prompt.text, list(prompt.token_ids), out, "text", prompt.category,
                                      ttft_ms=1.0, tpot_ms=0.5, e2e_ms=5.0, accept_lengths=[k, k + 1]))
    return RunResult(requests, steps, run_metrics(stats, requests, steps, duration_s=0.5))


@pytest.fixture
def fake_backend(monkeypatch):
    """Registers backend 'fake' whose behaviour a test sets with ``fake.behaviour``."""
    module = types.ModuleType("fake_backend")
    module.behaviour = "ok"

    def run(spec):
        if module.behaviour == "fail":
            raise RuntimeError("device exploded\nsecond line")
        if module.behaviour == "interrupt":
            raise KeyboardInterrupt
        return fake_result(spec)

    module.run = run
    monkeypatch.setitem(sys.modules, "fake_backend", module)
    monkeypatch.setitem(backends.BACKENDS, "fake", "fake_backend")
    return module


@pytest.fixture
def config(tiny_llama_dir, tiny_llama_draft_dir):
    cfg = compose_config(["+exp=quickstart", "pair=local", f"pair.target.path={tiny_llama_dir}",
                          f"pair.draft.path={tiny_llama_draft_dir}", "workload=random", "workload.num_prompts=3",
                          "tracking=disabled",
                          "speculator.num_speculative_tokens=3"])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg["backend"]["name"] = "fake"
    return cfg


def test_ok_run_writes_every_record(config, fake_backend, tmp_path):
    record = execute(config, RunContext(run_dir=tmp_path, experiment="quickstart"))
    assert record["status"] == "ok" and record["error"] is None
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "ok"
    assert saved["config"]["speculator"]["num_speculative_tokens"] == 3
    assert {"python", "torch", "device", "gpu", "specexp_version", "git_sha"} <= set(saved["env"])
    m = saved["metrics"]
    assert m["acceptance_length"] == 1 + m["num_accepted_tokens"] / m["num_drafts"] == 3.5
    assert m["per_position_acceptance"] == [1.0, 1.0, 0.5]

    outputs = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert len(outputs) == 3
    assert {"prompt_id", "prompt", "prompt_token_ids", "output_token_ids", "output_text"} <= set(outputs[0])

    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert len(steps) == 6 and {"step", "num_reqs", "num_tokens", "num_draft_tokens", "num_accepted_tokens",
                                "draft_ms", "verify_ms", "sample_ms", "schedule_ms"} <= set(steps.columns)

    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    choice = answers[0]["choices"][0]
    assert answers[0]["question_id"] == outputs[0]["prompt_id"]
    assert answers[0]["model_id"] == "fake-local-k3"
    assert choice["new_tokens"] == [7] and choice["accept_lengths"] == [3, 4] and choice["wall_time"] == [0.005]
    assert not list(tmp_path.glob(".*.tmp")), "atomic writes leave no temp files"


def test_failed_run_still_writes_result_json(config, fake_backend, tmp_path, capsys):
    fake_backend.behaviour = "fail"
    record = execute(config, RunContext(run_dir=tmp_path, experiment="quickstart"))
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == record["status"] == "failed"
    assert saved["error"] == "RuntimeError: device exploded"
    assert "Traceback" in (tmp_path / "error.log").read_text()
    assert not (tmp_path / "outputs.jsonl").exists()
    assert capsys.readouterr().err.strip() == "specexp: error: RuntimeError: device exploded"


def test_config_failure_is_recorded_before_any_model_loads(config, fake_backend, tmp_path):
    config["speculator"]["num_speculative_tokens"] = -1
    record = execute(config, RunContext(run_dir=tmp_path, experiment="quickstart"))
    assert record["status"] == "failed" and record["error_type"] == "config"
    assert json.loads((tmp_path / "result.json").read_text())["error"].startswith("speculator.num_speculative_tokens")


def test_interrupted_run_writes_result_json_then_reraises(config, fake_backend, tmp_path):
    fake_backend.behaviour = "interrupt"
    with pytest.raises(KeyboardInterrupt):
        execute(config, RunContext(run_dir=tmp_path, experiment="quickstart"))
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "interrupted" and "KeyboardInterrupt" in saved["error"]


def test_missing_backend_module_is_a_one_line_error(config, monkeypatch, tmp_path):
    monkeypatch.setitem(backends.BACKENDS, "fake", "specexp.backends.does_not_exist")
    record = execute(config, RunContext(run_dir=tmp_path, experiment="quickstart"))
    assert record["status"] == "failed"
    assert record["error"].startswith("backend 'fake' is not available: importing specexp.backends.does_not_exist")
