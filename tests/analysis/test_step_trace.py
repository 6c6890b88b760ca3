"""benchmarks/step_trace.py summarize: step period, device busy time and copy waits from a chrome trace."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from step_trace import load_trace, summarize_trace


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


def test_too_short_a_trace_is_refused_with_its_count():
    with pytest.raises(ValueError, match="holds 3 device-to-host copies"):
        summarize_trace(_trace(num_steps=3, period_us=1000.0, busy_us=400.0), skip_steps=3)
