"""Synthetic run records for the analysis tests: acceptance metrics come from specexp's own counter
(:class:`specexp.engine.stats.AcceptanceStats`), so the analysis is checked against the metrics every backend
produces. Fast: no model, no Hydra."""

from __future__ import annotations

import random

import pandas as pd

from specexp.engine.stats import AcceptanceStats


def synthetic_record(k: int, alpha: float = 0.7, tokens_per_s: float = 100.0, pair: str = "p",
                     workload: str = "w", group: str = "sweep_a", num_requests: int = 3,
                     drafts_per_request: int = 20, seed: int = 0, status: str = "ok", graph: dict | None = None) -> dict:
    """A result.json dict of a run at depth ``k`` whose drafts are accepted token by token with
    probability ``alpha`` (geometric), counted by AcceptanceStats."""
    rng = random.Random(seed * 1000 + k)
    stats = AcceptanceStats(num_speculative_tokens=k)
    for r in range(num_requests):
        for _ in range(drafts_per_request if k else 0):
            accepted = 0
            while accepted < k and rng.random() < alpha:
                accepted += 1
            stats.record(f"req-{r}", k, accepted)
    metrics = {
        "num_speculative_tokens": k, **stats.metrics(),
        "acceptance_histogram_per_request": stats.histograms_per_request(),
        "output_tokens_per_s": tokens_per_s,
        "ttft_ms": {"mean": 10.0, "p50": 10.0, "p90": 12.0, "p99": 13.0},
        "tpot_ms": {"mean": 5.0, "p50": 5.0, "p90": 6.0, "p99": 7.0},
        "draft_ms": {"mean": 1.0 * k, "p50": 1.0 * k, "p90": 1.0 * k, "p99": 1.0 * k},
        "verify_ms": {"mean": 10.0, "p50": 10.0, "p90": 10.0, "p99": 10.0},
        "sample_ms": {"mean": 0.1, "p50": 0.1, "p90": 0.1, "p99": 0.1},
        "schedule_ms": {"mean": 0.2, "p50": 0.2, "p90": 0.2, "p99": 0.2},
        **(graph or {"graph_capture_bytes": None, "graph_capture_s": None, "graph_capture_per_size": None,
                     "persistent_buffer_bytes": None}),
    }
    config = {
        "pair": {"name": pair, "target": {"path": f"{pair}-t"}, "draft": {"path": f"{pair}-d"}},
        "speculator": {"num_speculative_tokens": k, "cudagraph_mode": "none"},
        "engine": {"device": "cpu", "max_num_seqs": 8},
        "sampling": {"temperature": 0.0},
        "workload": {"name": workload, "num_prompts": num_requests},
        "backend": {"name": "native"},
        "tracking": {"wandb": {"mode": "disabled", "tags": []}},
        "name": "depth_sweep",
    }
    return {"status": status, "error": None if status == "ok" else "boom", "experiment": "depth_sweep",
            "started_at": "2026-11-29T10:00:00", "duration_s": 1.0, "config": config,
            "env": {"device": "cpu", "gpu": None}, "metrics": metrics if status == "ok" else {},
            "wandb": {"group": group}}


def synthetic_steps(k: int, num_reqs: int = 2, draft_forward_ms: float = 2.0, verify_ms: float = 10.0) -> pd.DataFrame:
    """steps.parquet rows: one prefill step, then decode steps of ``num_reqs`` requests carrying k drafts."""
    rows = [{"step": 0, "num_reqs": num_reqs, "num_tokens": 8 * num_reqs, "num_drafts": 0, "num_draft_tokens": 0,
             "num_accepted_tokens": 0, "num_output_tokens": num_reqs, "draft_ms": 50.0, "verify_ms": 99.0,
             "sample_ms": 0.1, "schedule_ms": 0.2, "step_ms": 150.0}]
    for s in range(1, 6):
        rows.append({"step": s, "num_reqs": num_reqs, "num_tokens": num_reqs * (k + 1), "num_drafts": num_reqs if k else 0,
                     "num_draft_tokens": num_reqs * k, "num_accepted_tokens": 0, "num_output_tokens": num_reqs,
                     "draft_ms": draft_forward_ms * k, "verify_ms": verify_ms, "sample_ms": 0.1,
                     "schedule_ms": 0.2, "step_ms": draft_forward_ms * k + verify_ms + 0.3})
    return pd.DataFrame(rows)
