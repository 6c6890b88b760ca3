"""Backend `native`: specexp's own engine (continuous batching, draft-model speculation, paged caches).

Turns a RunSpec into engine configs, loads the pair natively (torch + safetensors), warms up on the first
prompt, serves every prompt (all arriving together), and maps the engine's counters onto docs/design.md §4.
Latencies count from arrival; ``queue_ms`` is arrival -> the first step that runs the request (with more
requests than ``engine.max_num_seqs``, the wait for a batch slot).
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.progress import ProgressCallback
from specexp.engine.runner import EngineOutput, NativeEngine
from specexp.engine.stats import AcceptanceStats, request_latency
from specexp.errors import ConfigError
from specexp.models import load_model
from specexp.result import RequestOutput, RunResult, StepRecord, run_metrics
from specexp.specs import RunSpec

WARMUP_NEW_TOKENS = 4
END_OF_REQUEST_RULE = ("native: output token 0 from the prefill, undrafted; each later step drafts "
                       "min(k, tokens left - 1)")


def _int_tuple(values) -> tuple | None:
    """A config list as a tuple (None stays None; the engine's validation names bad entries)."""
    if values is None:
        return None
    return tuple(values) if isinstance(values, (list, tuple)) else (values,)


def engine_configs(spec: RunSpec) -> tuple[EngineConfig, SpeculatorConfig, SamplingConfig]:
    """The engine's plain configs from a RunSpec (unknown group keys come through `options`)."""
    e, s, sp = spec.engine, spec.speculator, spec.sampling
    engine = EngineConfig(
        device=e.device, dtype=spec.pair.dtype, max_num_seqs=e.max_num_seqs, max_model_len=e.max_model_len,
        max_num_batched_tokens=e.options.get("max_num_batched_tokens"), block_size=e.block_size,
        num_kv_blocks=e.options.get("num_kv_blocks"), cudagraph_mode=e.cudagraph_mode, seed=e.seed,
        cudagraph_capture_sizes=_int_tuple(e.options.get("cudagraph_capture_sizes")),
        cudagraph_seq_len_buckets=_int_tuple(e.options.get("cudagraph_seq_len_buckets")),
        cudagraph_prefill_tokens=_int_tuple(e.options.get("cudagraph_prefill_tokens")) or (),
        **{name: e.options.get(name, getattr(EngineConfig, name))  # absent: EngineConfig's own defaults
           for name in ("compile_pointwise", "linear_kernel", "fold_norm_weights", "attention_kernel", "conv_kernel",
                        "plain_decode_lookahead", "cudagraph_shared_pool")},
    )
    speculator = SpeculatorConfig(
        num_speculative_tokens=s.num_speculative_tokens, rejection=s.options.get("rejection", "standard"),
        synthetic_acceptance_rate=float(s.options.get("synthetic_acceptance_rate", 0.7)),
        cudagraph_mode=s.draft_graph_mode(e.cudagraph_mode),
    )
    sampling = SamplingConfig(
        temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, max_new_tokens=sp.max_new_tokens,
        ignore_eos=sp.ignore_eos,
    )
    return engine, speculator, sampling


def run(spec: RunSpec, progress: ProgressCallback | None = None) -> RunResult:
    """Serve spec.prompts with the native engine; outputs, per-step rows and §4 metrics. progress receives the
    CUDA-graph capture's events and the run's (not the warm-up's)."""
    engine_cfg, spec_cfg, sampling_cfg = engine_configs(spec)
    # Bad settings fail here, before any model is loaded.
    engine_cfg.validate()
    spec_cfg.validate(engine_cfg.max_model_len)
    sampling_cfg.validate()
    device = torch.device(engine_cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("engine.device=cuda but no CUDA GPU is visible: use engine.device=cpu")
    k = spec_cfg.num_speculative_tokens
    load = {"dtype": spec.pair.dtype, "device": device, "weights": spec.pair.weights, "seed": spec.pair.init_seed}
    target = load_model(spec.pair.target.path, **load)
    draft = load_model(spec.pair.draft.path, **load) if k > 0 else None
    engine = NativeEngine(target, draft, engine_cfg, spec_cfg, sampling_cfg, target.config.eos_token_ids,
                          progress=progress)
    engine.generate([spec.prompts[0].token_ids], max_new_tokens=min(WARMUP_NEW_TOKENS, sampling_cfg.max_new_tokens))
    out = engine.generate([p.token_ids for p in spec.prompts], progress=progress)
    tokenizer_path = spec.pair.target.tokenizer_path
    tokenizer = Tokenizer.from_file(tokenizer_path) if tokenizer_path else None
    return to_run_result(spec, out, k, tokenizer, device)


def to_run_result(spec: RunSpec, out: EngineOutput, k: int, tokenizer, device: torch.device) -> RunResult:
    """Map engine requests/steps onto RequestOutput/StepRecord and the §4 metrics."""
    acceptance = AcceptanceStats(k)
    requests = []
    for prompt, req in zip(spec.prompts, out.requests):
        for num_drafts, num_accepted in req.verifies:
            acceptance.record(prompt.id, num_drafts, num_accepted)
        output_ids = req.output_token_ids
        end_s = req.finish_s if req.finish_s is not None else out.total_s
        requests.append(RequestOutput(
            prompt_id=prompt.id, prompt=prompt.text, prompt_token_ids=list(prompt.token_ids),
            output_token_ids=output_ids, output_text=tokenizer.decode(output_ids) if tokenizer else "",
            category=prompt.category, accept_lengths=list(req.emitted_per_step),
            **request_latency(req.arrival_s, req.first_token_s if req.first_token_s is not None else end_s,
                              end_s, len(output_ids), scheduled_s=req.scheduled_s),
        ))
    steps = [
        StepRecord(
            step=s.step, num_reqs=s.num_reqs, num_tokens=s.num_tokens, num_drafts=s.num_drafts,
            num_draft_tokens=s.num_draft_tokens, num_accepted_tokens=s.num_accepted_tokens,
            num_output_tokens=s.num_output_tokens, draft_ms=s.draft_ms, verify_ms=s.verify_ms,
            sample_ms=s.sample_ms, schedule_ms=s.schedule_ms, step_ms=s.step_ms,
        )
        for s in out.steps
    ]
    graph = {}
    if device.type == "cuda":
        graph["persistent_buffer_bytes"] = out.persistent_buffer_bytes
    if out.graphs is not None:
        graph["graph_capture_bytes"] = out.graphs["graph_capture_bytes"]
        graph["graph_capture_s"] = out.graphs["graph_capture_s"]
        graph["graph_capture_per_size"] = [
            record for manager in out.graphs["managers"].values() for record in manager["per_size"]
        ]
    env = {"device": str(device)}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    metrics = run_metrics(acceptance, requests, steps, out.total_s, graph)
    metrics["end_of_request_rule"] = END_OF_REQUEST_RULE
    if out.graphs is not None:
        metrics["graph_replays"] = {
            name: {"num_replays": m["num_replays"], "num_eager": m["num_eager"]}
            for name, m in out.graphs["managers"].items()
        }
    return RunResult(requests, steps, metrics, env)
