"""Backend ``vllm`` under load, the parts that need neither vLLM nor a GPU: how a run's arrivals and synthetic
acceptance become ``vllm.LLM`` keywords, and how a closed loop's latencies are read from vLLM's timestamps.

- Arrivals: ``vllm.LLM.generate`` takes every request at once, so it serves ``burst`` and ``concurrency``
  (the closed loop: at most ``workload.max_concurrency`` requests run, each next one starting when one
  finishes, which is vLLM's own ``max_num_seqs`` limit over a queue of every request). Poisson and trace
  arrivals need a server with a clock (``vllm bench serve``) and are refused before the run with one line
  (:data:`specexp.run_spec.BACKEND_ARRIVALS`).
- Closed-loop latency: a request arrives when a slot frees, i.e. when vLLM first schedules it, so its
  latencies count from ``scheduled_ts`` and ``queue_ms`` is 0 (:func:`closed_loop_latency`).
- Synthetic acceptance (``speculator.rejection=synthetic``): vLLM 0.26's ``rejection_sample_method=
  "synthetic"`` with ``synthetic_acceptance_rates``, the per-position unconditional rates that every form
  of specexp's setting resolves to (:mod:`specexp.engine.synthetic`), so both engines impose the same
  acceptance.
"""

from __future__ import annotations

from typing import Any

from specexp.engine.stats import request_latency


def closed_loop(spec) -> bool:
    """Whether ``spec``'s requests arrive in a closed loop (``workload.arrival=concurrency``)."""
    return spec.arrivals is not None and spec.arrivals.kind == "concurrency"


def max_num_seqs(spec) -> int:
    """vLLM's ``max_num_seqs``: the closed loop's concurrency, else ``engine.max_num_seqs``."""
    return spec.arrivals.max_concurrency if closed_loop(spec) else spec.engine.max_num_seqs


def synthetic_speculative_config(spec) -> dict[str, Any]:
    """The ``speculative_config`` keys of synthetic acceptance (``{}`` for standard rejection)."""
    from specexp.engine_settings import engine_configs

    speculator = engine_configs(spec)[1]
    if speculator.rejection != "synthetic":
        return {}
    return {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": speculator.synthetic_rates()}


def closed_loop_latency(metrics, num_output_tokens: int) -> dict[str, float | None]:
    """``ttft_ms``/``tpot_ms``/``e2e_ms``/``queue_ms`` of one closed-loop request from vLLM's
    ``RequestStateStats`` (monotonic ``scheduled_ts``, ``first_token_ts``, ``last_token_ts``, in s) or
    V0's ``RequestMetrics`` (``first_scheduled_time``, ``first_token_time``, ``finished_time``): counted from
    the moment it was first scheduled, its arrival. ``None`` each where a timestamp is missing."""
    def field(*names: str) -> float | None:
        for name in names:
            value = getattr(metrics, name, None)
            if isinstance(value, (int, float)) and value > 0:
                return float(value)
        return None

    none = {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None, "queue_ms": None}
    if metrics is None:
        return none
    scheduled = field("scheduled_ts", "first_scheduled_time")
    first = field("first_token_ts", "first_token_time")
    last = field("last_token_ts", "finished_time", "last_token_time")
    if scheduled is None or first is None or last is None:
        return none
    return request_latency(scheduled, first, last, num_output_tokens, scheduled_s=scheduled)
