"""benchmarks/diagnostics/step_trace.py summarize: step period, device busy time and copy waits from a chrome trace."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics"))

from step_trace import STEP_LABEL, busy_us, idle_gaps, load_trace, summarize_first_step, summarize_trace


def _trace(num_steps: int, period_us: float, busy_us: float) -> list[dict]:
    """Steps of `period_us`, each: a pageable host-to-device copy, one kernel, then the read-back (whose host
    call waits for the kernel); busy_us of device work a step in all."""
    events, t, corr = [], 0.0, 0
    copy_us, read_back_us = 2.0, 3.0
    kernel_us = busy_us - copy_us - read_back_us
    for _ in range(num_steps):
        corr += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": t, "dur": 5.0,
                       "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": t + 10,
                       "dur": copy_us, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": "gemv", "ts": t + 20, "dur": kernel_us, "args": {}})
        corr += 1
        end = t + period_us - read_back_us
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": t + 30,
                       "dur": end - t - 30, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "ts": end,
                       "dur": read_back_us, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": t, "dur": 1.0, "args": {}})
        t += period_us
    return events


def test_summary_recovers_period_busy_time_and_copy_waits(tmp_path):
    events = _trace(num_steps=10, period_us=1000.0, busy_us=400.0)
    summary = summarize_trace(events, skip_steps=2)
    assert summary["steps"] == 7
    assert summary["step_period_us_median"] == pytest.approx(1000.0)
    assert summary["device_busy_us_median"] == pytest.approx(400.0)
    assert summary["device_idle_fraction"] == pytest.approx(0.6)
    waits = summary["host_us_in_cudaMemcpyAsync_median"]
    assert waits["Memcpy HtoD (Pageable -> Device)"] == pytest.approx(5.0)
    assert waits["Memcpy DtoH (Device -> Pageable)"] == pytest.approx(1000.0 - 3.0 - 30.0)
    path = tmp_path / "trace_k1.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert summarize_trace(load_trace(path), skip_steps=2) == summary


def test_idle_time_is_split_by_the_spans_around_it():
    """Each step idles 10 µs between the read-back and the next step's copy, 8 before the kernel and 582 after it:
    600 µs a step, the period less the busy time."""
    summary = summarize_trace(_trace(num_steps=10, period_us=1000.0, busy_us=400.0), skip_steps=2)
    pairs = [(p["before"], p["after"], p["idle_us_per_step"], p["gaps_per_step"]) for p in summary["idle_by_kernel_pair"]]
    assert pairs == [("gemv", "Memcpy DtoH (Device -> Pageable)", pytest.approx(582.0), 1.0),
                     ("Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pageable -> Device)", pytest.approx(10.0), 1.0),
                     ("Memcpy HtoD (Pageable -> Device)", "gemv", pytest.approx(8.0), 1.0)]
    assert sum(p[2] for p in pairs) == pytest.approx(summary["step_period_us_median"]
                                                     - summary["device_busy_us_median"])
    assert len(summarize_trace(_trace(10, 1000.0, 400.0), skip_steps=2, top_gaps=2)["idle_by_kernel_pair"]) == 2


def test_overlapping_spans_leave_no_gap_and_the_gap_names_the_span_that_ended_last():
    """b starts inside a (launched early) and ends after it; c starts inside b: one gap, from b's end to d."""
    spans = [{"name": n, "ts": ts, "dur": dur} for n, ts, dur in
             (("before", -5.0, 5.0), ("a", 2.0, 10.0), ("b", 6.0, 10.0), ("c", 8.0, 2.0), ("d", 30.0, 5.0),
              ("late", 50.0, 1.0))]
    assert idle_gaps(spans, 0.0, 40.0, "read-back") == [(2.0, "read-back", "a"), (14.0, "b", "d")]
    assert idle_gaps(spans, 7.0, 20.0, "x") == []  # covered by a and b to 16, then nothing starts before 20


def test_busy_time_counts_overlapping_kernels_once():
    """Kernels launched early overlap the one before them: the device is busy for the union of their spans, clipped
    to the window, never longer than the window."""
    spans = [{"ts": 0.0, "dur": 10.0}, {"ts": 6.0, "dur": 10.0}, {"ts": 8.0, "dur": 2.0}, {"ts": 30.0, "dur": 5.0},
             {"ts": 38.0, "dur": 10.0}]
    assert busy_us(spans, 0.0, 100.0) == pytest.approx(16.0 + 5.0 + 10.0)
    assert busy_us(spans, 5.0, 40.0) == pytest.approx(11.0 + 5.0 + 2.0)
    assert busy_us([{"ts": 0.0, "dur": 50.0}] * 3, 0.0, 20.0) == pytest.approx(20.0)


def test_too_short_a_trace_is_refused_with_its_count():
    with pytest.raises(ValueError, match="holds 3 device-to-host copies"):
        summarize_trace(_trace(num_steps=3, period_us=1000.0, busy_us=400.0), skip_steps=3)


def _span(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": {}}


def test_first_step_summary_splits_host_time_by_runtime_call_and_aten_self_time():
    """A 1000 µs first step (a linear holding an addmm, a copy, three launches, a blocking read-back) and two
    300 µs steps; the device works 50 µs in the first step's host range and 40 µs after it returns."""
    events = [
        _span("user_annotation", STEP_LABEL, 0.0, 1000.0),
        _span("gpu_user_annotation", STEP_LABEL, 5.0, 1100.0, tid=7),  # the device's copy of the range: ignored
        _span("cpu_op", "aten::linear", 10.0, 300.0),
        _span("cpu_op", "aten::addmm", 20.0, 200.0),
        _span("cpu_op", "aten::copy_", 400.0, 100.0),
        *[_span("cuda_runtime", "cudaLaunchKernel", 30.0 + 50 * i, 20.0) for i in range(3)],
        _span("cuda_runtime", "cudaMemcpyAsync", 600.0, 350.0),
        _span("kernel", "gemm", 100.0, 50.0, tid=7),
        _span("kernel", "draft_gemm", 1010.0, 40.0, tid=7),  # queued by the first step, runs after it returns
        _span("user_annotation", STEP_LABEL, 1200.0, 300.0),
        _span("kernel", "gemv", 1300.0, 30.0, tid=7),
        _span("user_annotation", STEP_LABEL, 1600.0, 300.0),
    ]
    first = summarize_first_step(events)
    assert first["first_step_host_us"] == 1000.0
    assert first["later_steps_host_us_median"] == 300.0
    assert first["device_busy_us"] == 90.0 and first["kernels"] == 2
    assert first["cuda_runtime"] == {"cudaMemcpyAsync": {"calls": 1, "host_us": 350.0},
                                     "cudaLaunchKernel": {"calls": 3, "host_us": 60.0}}
    assert first["top_aten_self_us"] == {"aten::addmm": 200.0, "aten::linear": 100.0, "aten::copy_": 100.0}


def test_first_step_summary_needs_step_ranges():
    with pytest.raises(ValueError, match="no 'specexp::step' ranges"):
        summarize_first_step(_trace(num_steps=4, period_us=1000.0, busy_us=400.0))


def test_record_names_the_valid_pairs():
    """`record` with an unknown pair: one line naming the valid pairs, exit 2 (its imports resolve when the script
    is run by path from the repository root)."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics" / "step_trace.py"
    done = subprocess.run([sys.executable, str(script), "record", "--pair", "gpt-2+nothing"], check=False,
                          capture_output=True, text=True, cwd=script.parents[2])
    assert done.returncode == 2, done.stderr
    assert "--pair=gpt-2+nothing: valid are lfm2-1.2b+lfm2-350m, llama-3.2-1b+llama-100m" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
