"""backend_compare compares like for like: every backend's TTFT counts from the request's arrival, queueing
is reported apart as queue_ms, and each record states its backend's end-of-request rule."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

# A two-job CLI sweep of real models (about a minute on a 2-core CPU).
pytestmark = pytest.mark.slow


def test_native_and_hf_measure_ttft_from_arrival_with_queueing_apart(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "SPECEXP_RUNS_DIR": str(tmp_path / "runs")}
    args = ["run", "+exp=backend_compare", "engine=cpu", "backend=native,hf", "pair=local",
            f"pair.target.path={tiny_llama_dir}", f"pair.draft.path={tiny_llama_draft_dir}", "workload=random",
            "workload.num_prompts=3", "workload.input_len=6", "workload.output_len=8", "tracking=disabled",
            f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run([sys.executable, "-m", "specexp", *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job, backend in enumerate(["native", "hf"]):
        record = json.loads((sweep_dir / str(job) / "result.json").read_text())
        assert record["config"]["backend"]["name"] == backend
        assert record["metrics"]["end_of_request_rule"].startswith(f"{backend}:")
        rows = [json.loads(line) for line in (sweep_dir / str(job) / "outputs.jsonl").read_text().splitlines()]
        queue = [r["queue_ms"] for r in rows]
        assert all(q is not None and q >= 0 for q in queue), backend
        # batch 1 (max_num_seqs=1): each request waits for the ones before it, inside its TTFT
        assert queue == sorted(queue) and queue[0] < rows[0]["ttft_ms"], backend
        for before, after in itertools.pairwise(rows):
            assert after["queue_ms"] >= 0.9 * before["e2e_ms"], backend
        for r in rows:
            assert r["queue_ms"] <= r["ttft_ms"] <= r["e2e_ms"], backend
        assert record["metrics"]["queue_ms"]["mean"] > 0
