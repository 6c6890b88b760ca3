"""A run's console summary through the CLI: what acceptance length means, where the W&B run went, no graph
lines on CPU; and W&B's staged artifact files inside the run directory, not in the user's home."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specexp.tracking.summary import format_summary


def tiny_run(tmp_path, target, draft, *extra):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "NETRC": str(tmp_path / "no-netrc"),
           "SPECEXP_RUNS_DIR": str(tmp_path / "runs")}
    for name in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "WANDB_DATA_DIR", "WANDB_API_KEY", "WANDB_MODE"):
        env.pop(name, None)
    run_dir = tmp_path / "run"
    args = ["run", "pair=local", f"pair.target.path={target}", f"pair.draft.path={draft}", "workload=random",
            "workload.num_prompts=2", "workload.input_len=6", "workload.output_len=8",
            "speculator.num_speculative_tokens=3", f"hydra.run.dir={run_dir}", *extra]
    proc = subprocess.run([sys.executable, "-m", "specexp", *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, run_dir, home


def summary_rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("  ") and "  " in line.strip():
            name, _, value = line.strip().partition("  ")
            rows[name.strip()] = value.strip()
    return rows


@pytest.mark.slow
def test_the_summary_says_what_acceptance_means_and_where_the_wandb_run_is(tmp_path, tiny_llama_dir,
                                                                          tiny_llama_draft_dir):
    proc, run_dir, home = tiny_run(tmp_path, tiny_llama_dir, tiny_llama_draft_dir)
    rows = summary_rows(proc.stdout)
    assert "tokens emitted per target verification" in rows["acceptance_length"]
    assert "4 = all 3" in rows["acceptance_length"]
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    assert rows["W&B"] == f"offline: {offline} (upload later: wandb sync {offline})"
    assert not [name for name in rows if name.startswith(("graph", "persistent"))], "no graph lines on CPU"
    assert rows["end-of-request rule"].startswith("native:")
    assert "queue_ms (part of ttft) mean/p50/p99" in rows and "ttft_ms from arrival mean/p50/p99" in rows

    record = json.loads((run_dir / "result.json").read_text())
    assert record["wandb"]["dir"] == str(offline) and record["wandb"]["run_id"] in offline.name
    # wandb stages the result.json artifact inside the run directory, none of it in the user's home
    staged = [json.loads(p.read_text()) for p in (run_dir / "wandb" / "artifacts" / "staging").iterdir()]
    (result,) = [s for s in staged if "status" in s]  # the others: the acceptance tables
    assert result["status"] == "ok" and result["wandb"]["dir"] == str(offline)
    assert not (home / ".local" / "share" / "wandb").exists()


@pytest.mark.slow
def test_disabled_tracking_says_so(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    proc, run_dir, _ = tiny_run(tmp_path, tiny_llama_dir, tiny_llama_draft_dir, "tracking=disabled")
    assert summary_rows(proc.stdout)["W&B"] == "off (tracking=disabled)"
    assert not (run_dir / "wandb").exists()


@pytest.mark.parametrize(("device", "shown"), [("cpu", False), ("cuda:0", True)])
def test_graph_lines_only_for_cuda_runs(device, shown):
    record = {"status": "ok", "run_dir": "r", "env": {"device": device}, "wandb": {"mode": "disabled"},
              "metrics": {"num_speculative_tokens": 2, "acceptance_length": 2.0, "graph_capture_bytes": 2**21,
                          "graph_capture_s": 1.5, "persistent_buffer_bytes": 2**20}}
    rows = summary_rows(format_summary(record))
    assert (rows.get("graph_capture_bytes / _s") == "2.0 MiB / 1.50") == shown
    assert (rows.get("persistent_buffer_bytes") == "1.0 MiB") == shown


def test_a_dynamic_depth_run_says_how_many_steps_ran_each_k():
    record = {"status": "ok", "run_dir": "r", "env": {"device": "cpu"}, "wandb": {"mode": "disabled"},
              "metrics": {"num_speculative_tokens": 4, "num_speculative_tokens_hist": [2, 0, 5, 0, 1]}}
    assert summary_rows(format_summary(record))["steps per k (num_speculative_tokens_hist)"] == "k=0:2 k=2:5 k=4:1"
    static = {**record, "metrics": {"num_speculative_tokens": 4, "num_speculative_tokens_hist": [0, 0, 0, 0, 9]}}
    assert "steps per k (num_speculative_tokens_hist)" not in summary_rows(format_summary(static))


def test_whole_run_acceptance_counters_say_why_they_have_no_interval():
    """vLLM counts acceptance for the whole run: the summary says so instead of a bootstrap over 0 requests."""
    note = "no per-request counts (this backend counts acceptance for the whole run only)"
    boot = {"unit": "request", "num_requests": 0, "acceptance_length": {"low": None, "high": None}, "note": note}
    record = {"status": "ok", "run_dir": "r", "env": {"device": "cuda:0"}, "wandb": {"mode": "disabled"},
              "metrics": {"num_speculative_tokens": 4, "acceptance_length": 3.3567, "num_drafts": 2456,
                          "intervals": {"acceptance": boot}}}
    shown = summary_rows(format_summary(record))["acceptance_length"]
    assert shown.startswith(f"3.36 (no interval: {note})"), shown
    assert "over 0 requests" not in shown
    per_request = {**boot, "num_requests": 8, "acceptance_length": {"low": 3.1, "high": 3.6}}
    record["metrics"]["intervals"] = {"acceptance": per_request}
    assert summary_rows(format_summary(record))["acceptance_length"].startswith(
        "3.36 [3.10, 3.60] 95% bootstrap over 8 requests")
