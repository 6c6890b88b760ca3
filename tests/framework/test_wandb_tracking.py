"""W&B: offline by default (files inside the run directory, no network), online falls back to offline with
one warning line, disabled writes nothing. W&B is never required for a run to finish."""

import json
from pathlib import Path

import pytest

from specexp.tracking.wandb_run import flatten, log_run


def record_in(run_dir: Path) -> dict:
    record = {
        "status": "ok",
        "error": None,
        "config": {"speculator": {"num_speculative_tokens": 2}, "backend": {"name": "hf"}},
        "metrics": {
            "num_drafts": 2, "acceptance_length": 2.5, "accepted_per_position": [2, 1],
            "drafted_per_position": [2, 2], "per_position_acceptance": [1.0, 0.5],
            "conditional_acceptance": [1.0, 0.5], "acceptance_histogram": [0, 1, 1],
            "acceptance_histogram_per_request": {"a": [0, 1, 1]}, "ttft_ms": {"mean": 3.0, "p50": 3.0},
        },
    }
    (run_dir / "result.json").write_text(json.dumps(record))
    return record


@pytest.fixture
def no_wandb_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def test_flatten_joins_nested_keys():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {"a.b": 1, "a.c.d": [1, 2], "e": None}


def test_offline_run_is_written_inside_the_run_directory(tmp_path, no_wandb_credentials):
    mode = log_run(record_in(tmp_path), tmp_path, "offline", {"project": "specexp-test", "group": "g", "job_type": "t"})
    assert mode == "offline"
    (run,) = offline_runs(tmp_path)
    assert list(run.glob("*.wandb")), "the offline run's data file exists"


def test_online_without_credentials_falls_back_to_offline_with_one_warning(tmp_path, no_wandb_credentials, capsys):
    mode = log_run(record_in(tmp_path), tmp_path, "online", {"project": "specexp-test"})
    assert mode == "offline"
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("specexp: warning:") and "offline" in warnings[0]
    assert len(offline_runs(tmp_path)) == 1


def test_disabled_writes_nothing(tmp_path):
    assert log_run(record_in(tmp_path), tmp_path, "disabled", {}) == "disabled"
    assert not (tmp_path / "wandb").exists()


def test_steps_per_k_and_the_histogram_by_draft_length_are_logged_as_tables():
    import wandb

    from specexp.tracking.wandb_run import _tables

    metrics = {**record_in_metrics(), "num_speculative_tokens_hist": [1, 3, 2],
               "acceptance_length_by_num_speculative_tokens": [None, 1.5, 2.0],
               "acceptance_histogram_by_draft_length": [[0], [1, 1], [0, 1, 1]]}
    tables = _tables(wandb, metrics)
    assert tables["num_speculative_tokens_hist"].data == [[0, 1, None], [1, 3, 1.5], [2, 2, 2.0]]
    assert tables["acceptance_histogram_by_draft_length"].data == [[1, 0, 1], [1, 1, 1], [2, 0, 0], [2, 1, 1],
                                                                   [2, 2, 1]]


def record_in_metrics() -> dict:
    return {"num_drafts": 4, "accepted_per_position": [3, 1], "drafted_per_position": [4, 2],
            "per_position_acceptance": [0.75, 0.25], "conditional_acceptance": [0.75, 0.33],
            "acceptance_histogram": [1, 2, 1], "acceptance_histogram_per_request": {"a": [1, 2, 1]}}
