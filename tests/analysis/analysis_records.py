"""Synthetic run records for the analysis tests: acceptance metrics come from specexp's own counter
(:class:`specexp.engine.stats.AcceptanceStats`), so the analysis is checked against the metrics every backend
produces. Fast: no model, no Hydra."""

from __future__ import annotations

import random

import pandas as pd

from specexp.engine.stats import AcceptanceStats


def synthetic_record(k: int, alpha: float = 0.7, tokens_per_s: float = 100.0, pair: str = "p",
                     workload: str = "w", group: str = "sweep_a", num_requests: int = 3,
                     drafts_per_request: int = 20, seed: int = 0, status: str = "ok", graph: dict | None = None,
                     max_num_seqs: int = 8, gpu: str | None = None, backend: str = "native",
                     latency_ms: tuple[float, float] = (10.0, 5.0)) -> dict:
    """A result.json dict of a run at depth ``k`` whose drafts are accepted token by token with
    probability ``alpha`` (geometric), counted by AcceptanceStats. ``gpu``: the run ran on this GPU
    (``engine.device`` cuda) instead of the CPU; ``latency_ms``: its (TTFT p50, TPOT p50), p90/p99 above."""
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
        "drafted_per_position_per_request": {rid: list(c.drafted_per_position) for rid, c in stats.per_request.items()},
        "output_tokens_per_s": tokens_per_s,
        "ttft_ms": _percentiles(latency_ms[0]),
        "tpot_ms": _percentiles(latency_ms[1]),
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
        "engine": {"device": "cuda" if gpu else "cpu", "max_num_seqs": max_num_seqs},
        "sampling": {"temperature": 0.0},
        "workload": {"name": workload, "num_prompts": num_requests},
        "backend": {"name": backend},
        "tracking": {"wandb": {"mode": "disabled", "tags": []}},
        "name": "depth_sweep",
    }
    return {"status": status, "error": None if status == "ok" else "boom", "experiment": "depth_sweep",
            "started_at": "2026-11-29T10:00:00", "duration_s": 1.0, "config": config,
            "env": {"device": "cuda" if gpu else "cpu", "gpu": gpu}, "metrics": metrics if status == "ok" else {},
            "wandb": {"group": group}}


def _percentiles(p50: float) -> dict:
    return {"mean": p50 * 1.05, "p50": p50, "p90": p50 * 1.2, "p99": p50 * 1.3}


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The engine's default captured batch sizes: 1, 2, 4, ... up to max_num_seqs."""
    sizes, size = [], 1
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    return [*sizes, max_num_seqs]


def synthetic_graph(k: int, max_num_seqs: int, scale: float = 1.0, buckets=(256, 528),
                    prompt_tokens=(16, 32, 64, 128), warmup_bytes: int = 78 * 2**20) -> dict:
    """Graph metrics shaped like the native engine's on a GPU (per-size records of target_verify,
    draft_prefill, draft_decode for k >= 2, and one prompt-prefill manager per token count, each at every
    key-length bucket; in a shared pool the first, largest graph of a manager takes most of its memory), with
    magnitudes of an H200 run of a 1B pair times ``scale``."""
    mib = 2**20
    first_bytes = {"target_verify": 270 * mib, "draft_prefill": 46 * mib, "draft_decode": 52 * mib}
    records = []
    for manager, tokens in (("target_verify", k + 1), ("draft_prefill", k + 2), ("draft_decode", 1)):
        if (manager != "target_verify" and k == 0) or (manager == "draft_decode" and k < 2):
            continue
        for i, size in enumerate(sorted(capture_sizes(max_num_seqs), reverse=True)):
            for j, bucket in enumerate(sorted(buckets, reverse=True)):
                grows = first_bytes[manager] * (1 + 0.05 * k) * (size / max_num_seqs) ** 0.5 if i == j == 0 else 2 * mib * ((i + j) % 2)
                records.append({"manager": manager, "num_reqs": size, "num_tokens": size * tokens,
                                "max_seq_len": bucket, "capture_bytes": int(grows * scale) // mib * mib,
                                "reserved_bytes": 0, "capture_s": 0.004 + 0.0002 * size})
    for model, offset in (("target_prefill", 0), ("draft_prompt_prefill", 1)):
        for n in prompt_tokens:
            for j, bucket in enumerate(sorted(buckets, reverse=True)):
                records.append({"manager": f"{model}_{n + offset}", "num_reqs": 1, "num_tokens": n + offset,
                                "max_seq_len": bucket, "capture_bytes": int(n / 4 * scale) * mib if j == 0 else 0,
                                "reserved_bytes": 0, "capture_s": 0.01})
    total = sum(r["capture_bytes"] for r in records) + int(warmup_bytes * scale)
    return {"graph_capture_bytes": total, "graph_capture_s": sum(r["capture_s"] for r in records) + 0.8,
            "graph_capture_per_size": records, "persistent_buffer_bytes": 40 * mib}


# The three sweeps every figure must stay readable on: one captured size, seven sizes, several pairs.
FIGURE_SWEEPS = {
    "one_size": [{"pair": "tiny_lfm2", "max_num_seqs": 1, "ks": range(9)}],
    "seven_sizes": [{"pair": "lfm2_1b_random", "max_num_seqs": 64, "ks": range(9)}],
    "multi_pair": [{"pair": pair, "max_num_seqs": 8, "ks": range(5), "alpha": alpha, "scale": scale}
                   for pair, alpha, scale in (("tiny_lfm2", 0.55, 0.1), ("lfm2_1b_random", 0.3, 1.0),
                                              ("llama_1b_random", 0.3, 0.9), ("tiny_llama", 0.75, 0.1))],
}


def figure_sweep(name: str, gpu: str = "NVIDIA H200"):
    """(subdir, record, steps) of every run of the sweep ``name`` of :data:`FIGURE_SWEEPS`: a depth sweep of
    each pair on a GPU, throughput and latency shaped by the acceptance the draws give."""
    for spec in FIGURE_SWEEPS[name]:
        alpha, scale = spec.get("alpha", 0.6), spec.get("scale", 1.0)
        for k in spec["ks"]:
            draft_ms, verify_ms = 0.6 * scale + 0.3, 4.0 * scale + 1.0 + 0.15 * k
            step_ms = draft_ms * k + verify_ms + 0.3
            expected = (1 - alpha ** (k + 1)) / (1 - alpha)
            record = synthetic_record(
                k, alpha=alpha, pair=spec["pair"], workload="code", group=f"depth_sweep_{name}", seed=k,
                num_requests=6, max_num_seqs=spec["max_num_seqs"], gpu=gpu,
                tokens_per_s=spec["max_num_seqs"] * 1000.0 * expected / step_ms,
                latency_ms=(20.0 + step_ms, step_ms / expected),
                graph=synthetic_graph(k, spec["max_num_seqs"], scale=scale))
            yield f"{name}/{spec['pair']}-{k}", record, synthetic_steps(k, draft_forward_ms=draft_ms,
                                                                      verify_ms=verify_ms)


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


def with_repeats(record: dict, tokens_per_s: list[float], noisy: bool = False) -> dict:
    """``record`` as a run of ``len(tokens_per_s)`` repeats: per-repeat figures, the intervals over them and
    the bootstrap over its requests (specexp.measure.intervals), the mean as its tokens/s; ``noisy``: its
    record marks every timing figure (a busy machine)."""
    from specexp.measure.intervals import bootstrap_acceptance, repeat_summary

    metrics = record["metrics"]
    summary = repeat_summary(tokens_per_s)
    metrics["output_tokens_per_s"] = summary["mean"]
    metrics["num_repeats"] = len(tokens_per_s)
    metrics["num_requests"] = record["config"]["workload"]["num_prompts"]
    metrics["intervals"] = {"output_tokens_per_s": summary,
                            "acceptance": bootstrap_acceptance(list(metrics["acceptance_histogram_per_request"].values()))}
    metrics["noise"] = {"flags": ["machine_busy"] if noisy else [], "figures": ["timing"] if noisy else [],
                        "warnings": ["the machine was busy (1-min load 3.41 > 1 x 2 cores)"] if noisy else []}
    record["repeats"] = [{"repeat": r, "figures": {"output_tokens_per_s": v}} for r, v in enumerate(tokens_per_s)]
    record["measure"] = {"order": "interleaved", "engine_builds": 1, "warmup_requests": 1}
    return record
