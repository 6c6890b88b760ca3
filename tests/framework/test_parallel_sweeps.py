"""A local sweep on device slots, end to end on CPU: the GPUs are faked with the launcher's documented test
hook (``SPECEXP_FAKE_GPUS``), so every job's process gets ``CUDA_VISIBLE_DEVICES`` for its slot while its
models run on the CPU. Checked from what the sweep recorded: two jobs at a time, never two on one GPU, a freed
GPU taken by the next job at once, a failed job's GPU freed, and each job's record naming the jobs that
overlapped it and marking its timings when they did."""

from __future__ import annotations

import json
import os
from datetime import datetime

import pytest
from cli_runs import mismatched_checkpoint, run_cli

from specexp.measure import guards, overlap

# Each test runs real sweeps in subprocesses (about a minute on a 2-core CPU): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow

SLACK_S = 5.0  # a freed slot is taken within the launcher's poll interval; this allows for a loaded machine


def test_a_sweep_on_two_fake_gpus_runs_two_jobs_at_a_time_and_records_who_ran_beside_whom(
        tmp_path, monkeypatch, tiny_llama_dir, tiny_llama_draft_dir):
    monkeypatch.setenv("SPECEXP_FAKE_GPUS", "2")
    sweep_dir = tmp_path / "sweep"
    broken = mismatched_checkpoint(tiny_llama_draft_dir, tmp_path / "broken-draft")
    proc = run_cli(["run", "-m", "pair=local", f"pair.target.path={tiny_llama_dir}",
                    f"pair.draft.path={tiny_llama_draft_dir},{tiny_llama_draft_dir},{broken}",
                    "speculator.num_speculative_tokens=2", "workload.num_prompts=2", "workload.input_len=6",
                    "workload.output_len=48", "measure.repeats=2", "tracking=disabled", "sweep.devices=0,1",
                    f"hydra.sweep.dir={sweep_dir}"], tmp_path / "runs", timeout=600)
    assert proc.returncode == 1, proc.stderr  # job 2 failed, the sweep went on
    assert "sweep: 2 device slots (GPU 0, GPU 1): up to 2 jobs at once (fake GPUs" in proc.stdout
    assert "sweep: 3 jobs, 2 ok, 1 not ok" in proc.stdout

    timeline = json.loads((sweep_dir / "sweep.json").read_text())
    spans = {s["job"]: s for s in timeline["jobs"]}
    records = {n: json.loads((sweep_dir / str(n) / "result.json").read_text()) for n in range(3)}
    assert [records[n]["status"] for n in range(3)] == ["ok", "ok", "failed"]
    assert {spans[n]["status"] for n in range(3)} == {"ok", "failed"} and spans[2]["status"] == "failed"

    # two processes at a time: jobs 0 and 1 started before either ended, each on a GPU of its own
    assert max(spans[0]["start_s"], spans[1]["start_s"]) < min(spans[0]["end_s"], spans[1]["end_s"])
    assert {spans[0]["cuda_visible_devices"], spans[1]["cuda_visible_devices"]} == {"0", "1"}
    assert len({records[n]["env"]["pid"] for n in range(3)}) == 3, "one process per job"
    for n in range(3):
        assert records[n]["placement"]["cuda_visible_devices"] == spans[n]["cuda_visible_devices"]
        assert records[n]["placement"]["fake_devices"] is True
    for n in (0, 1):  # what the job's own process was shown, and the summary line naming its GPU
        assert records[n]["env"]["cuda_visible_devices"] == spans[n]["cuda_visible_devices"]
        assert f"  job {n} (pair.draft.path={tiny_llama_draft_dir}) on GPU {spans[n]['cuda_visible_devices']}: k=2:" \
            in proc.stdout
    assert f"  job 2: failed on GPU {spans[2]['cuda_visible_devices']}" in proc.stdout

    # never two jobs on one GPU at once; job 2 took the first GPU freed, the moment it was freed
    for a in spans.values():
        for b in spans.values():
            if a["job"] < b["job"] and a["devices"] == b["devices"]:
                assert overlap.overlap_s(a["start_s"], a["end_s"], b["start_s"], b["end_s"]) == 0
    first_free = min((spans[0], spans[1]), key=lambda s: s["end_s"])
    assert spans[2]["devices"] == first_free["devices"]
    assert first_free["end_s"] <= spans[2]["start_s"] <= first_free["end_s"] + SLACK_S

    # each ok job lists the jobs beside it, as the spans say; its timings are marked when one ran while it measured
    flagged = []
    for n in (0, 1):
        beside = records[n]["concurrent_jobs"]
        window = overlap.measured_window(records[n]["repeats"])
        ran_beside = {m for m in range(3) if m != n and overlap.overlap_s(
            spans[n]["start_s"], spans[n]["end_s"], spans[m]["start_s"], spans[m]["end_s"]) > 0}
        listed = {c["job"] for c in beside}
        # listed when its measurement ended: every job that had started by then, none that never met it
        assert {m for m in ran_beside if spans[m]["start_s"] < window[1]} <= listed <= ran_beside
        assert any(c["job"] == 1 - n and c["overlap_s"] > 0 for c in beside), "jobs 0 and 1 ran together"
        for c in beside:
            m = spans[c["job"]]
            expected = overlap.overlap_s(window[0], window[1], m["start_s"], m["end_s"] or window[1])
            assert c["measured_overlap_s"] == pytest.approx(expected, abs=0.5)
        disturbed = any(c["measured_overlap_s"] > 0 for c in beside)
        noise = records[n]["metrics"]["noise"]
        assert (guards.OVERLAPPED in noise["flags"]) == disturbed
        assert any("ran on this host while it measured" in w for w in noise["warnings"]) == disturbed
        flagged.append(disturbed)
    # started together, jobs 0 and 1 cannot both have measured while the other was not there
    assert any(flagged)
    assert records[0]["measure"]["order"] == "back_to_back"
    assert "at once on separate GPUs" in records[0]["measure"]["order_note"]
    assert (sweep_dir / "0" / "console.log").is_file() and "acceptance_length" in (sweep_dir / "0" / "console.log").read_text()
    # the summary file lists where each job ran and who overlapped its whole run
    assert all(spans[n]["concurrent"] for n in (0, 1))


def test_without_gpus_a_sweep_runs_its_jobs_one_after_another_as_before(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(["run", "-m", "pair=local", f"pair.target.path={tiny_llama_dir}",
                    f"pair.draft.path={tiny_llama_draft_dir}", "speculator.num_speculative_tokens=1,2",
                    "workload.num_prompts=1", "workload.input_len=6", "workload.output_len=4", "tracking=disabled",
                    f"hydra.sweep.dir={sweep_dir}"], tmp_path / "runs", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "device slot" not in proc.stdout and not (sweep_dir / "sweep.json").exists()
    records = [json.loads((sweep_dir / str(n) / "result.json").read_text()) for n in range(2)]
    assert all("placement" not in r and "concurrent_jobs" not in r for r in records)
    assert all(r["env"]["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES") for r in records)
    first_start = datetime.fromisoformat(records[0]["started_at"]).timestamp()
    second_start = datetime.fromisoformat(records[1]["started_at"]).timestamp()
    assert second_start >= first_start + records[0]["duration_s"] - 1.0, "job 1 started after job 0 ended"
