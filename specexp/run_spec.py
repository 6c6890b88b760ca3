"""A run's RunSpec, built from its resolved config after checking every value, file and limit.

:func:`build_run_spec` makes every check a run needs before any backend module or model loads, for every
backend alike, and raises a one-line :class:`ConfigError` for the first problem: keys and values
(:mod:`specexp.config_schema`), the engine's own settings (:mod:`specexp.engine_settings`), both checkpoints
(:mod:`specexp.pairs`), the prompts (readable, UTF-8, each within ``engine.max_model_len`` and the models'
``max_position_embeddings``), what the chosen backend implements. It writes nothing, so the CLI runs it for
every job of a sweep before the first job starts.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from pathlib import Path

from specexp import text_files
from specexp.errors import ConfigError


def _check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("engine.device=cuda but no CUDA GPU is available: use engine=cpu (engine.device=cpu)")


DEPTH_MODE_KEYS = ("num_speculative_tokens_per_batch_size", "draft_confidence_threshold", "adaptive")
# The arrival processes (workload.arrival) each backend serves: hf serves one request at a time from a list,
# vllm.LLM takes every request at once (a closed loop through its max_num_seqs).
BACKEND_ARRIVALS = {"native": ("burst", "poisson", "concurrency", "trace"), "hf": ("burst",),
                    "vllm": ("burst", "concurrency")}
SYNTHETIC_BACKENDS = ("native", "vllm")


def _check_backend_support(backend: str, speculator, engine) -> None:
    """Settings only some backends implement, refused where the chosen one would ignore them."""
    rejection = speculator.options.get("rejection", "standard")
    depth = [f"speculator.{name}={speculator.options[name]!r}" for name in DEPTH_MODE_KEYS
             if speculator.options.get(name) not in (None, 0, 0.0, "off")]
    if depth and backend != "native":
        raise ConfigError(f"{depth[0]} (a per-step depth mode) is implemented by backend native only (backend="
                          f"{backend}): use backend=native, or a fixed speculator.num_speculative_tokens")
    if rejection != "standard" and backend not in SYNTHETIC_BACKENDS:
        raise ConfigError(f"speculator.rejection={rejection!r} is implemented by backends"
                          f" {', '.join(SYNTHETIC_BACKENDS)} only (backend={backend}): use backend=native, or"
                          " speculator.rejection=standard")
    _check_tensor_parallel(backend, speculator, engine)
    if backend == "vllm":
        if engine.device != "cuda":
            raise ConfigError(f"backend vllm runs on CUDA only, engine.device={engine.device}: use engine=cuda")
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("backend vllm needs the 'vllm' package, which is not installed: pip install -e"
                              " '.[vllm]' on a GPU machine with torch 2.11")
        _check_visible_gpus(backend, engine)


def _check_tensor_parallel(backend: str, speculator, engine) -> None:
    """``engine.tensor_parallel_size`` and ``speculator.draft_tensor_parallel_size``: more than one GPU per model
    only on vLLM, and a draft split as vLLM allows (1 or the target's size, as its ``SpeculativeConfig`` checks).
    Checked before vLLM's presence, so the refusal is the same on any machine."""
    tp = int(engine.options.get("tensor_parallel_size") or 1)
    draft_tp = speculator.options.get("draft_tensor_parallel_size")
    if backend != "vllm":
        if tp > 1:
            raise ConfigError(f"engine.tensor_parallel_size={tp}: backend {backend} runs the target on one device;"
                              " tensor parallelism needs backend=vllm (or engine.tensor_parallel_size=1)")
        if draft_tp not in (None, 1):
            raise ConfigError(f"speculator.draft_tensor_parallel_size={draft_tp}: backend {backend} runs the draft on"
                              " one device; tensor parallelism needs backend=vllm (or leave it null)")
        return
    if draft_tp not in (None, 1, tp):
        raise ConfigError(f"speculator.draft_tensor_parallel_size={draft_tp} is not valid with"
                          f" engine.tensor_parallel_size={tp}: vLLM takes 1 or {tp} (null = the target's, {tp})")


def _check_visible_gpus(backend: str, engine) -> None:
    """A vLLM run split over N GPUs needs N visible (a sweep job sees its slot's: sweep.gpus_per_job)."""
    tp = int(engine.options.get("tensor_parallel_size") or 1)
    if backend != "vllm" or tp <= 1:
        return
    import os

    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < tp:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
        raise ConfigError(f"engine.tensor_parallel_size={tp} needs {tp} GPUs, and this process sees {count}{where}:"
                          " lower it, or run where more GPUs are visible")


def _check_prompt_lengths(prompts: list, max_new_tokens: int, max_model_len: int) -> None:
    for p in prompts:
        if not p.token_ids:
            raise ConfigError(f"prompt '{p.id}' has no tokens (empty text, and the tokenizer adds no BOS):"
                              " drop it or give it text")
        if len(p.token_ids) + max_new_tokens > max_model_len:
            raise ConfigError(
                f"prompt '{p.id}' has {len(p.token_ids)} tokens + {max_new_tokens} new tokens >"
                f" engine.max_model_len={max_model_len}: raise engine.max_model_len or shorten the prompt"
            )


def _check_positions(pair, k: int, prompts: list, max_new_tokens: int, engine) -> list[str]:
    """Requests must stay within the positions each model was trained for (config.json's
    max_position_embeddings) unless ``engine.allow_long_max_model_len=true``; returns the warning line for an
    ``engine.max_model_len`` above them (none if it is within them)."""
    allow = bool(engine.options.get("allow_long_max_model_len", False))
    longest = max(len(p.token_ids) for p in prompts) + max_new_tokens
    models = [("target", pair.target)] + ([("draft", pair.draft)] if k > 0 else [])
    limits = [(role, m.max_position_embeddings, Path(m.path) / "config.json") for role, m in models
              if m.max_position_embeddings is not None]
    for role, limit, config in limits:
        if longest > limit and not allow:
            raise ConfigError(
                f"prompt + sampling.max_new_tokens reach {longest} positions, past the {role}'s"
                f" max_position_embeddings={limit} ({config}): positions beyond {limit} were never trained;"
                " shorten the prompts or max_new_tokens, or set engine.allow_long_max_model_len=true"
            )
    above = [(role, limit) for role, limit, _ in limits if engine.max_model_len > limit]
    if not above:
        return []
    named = " and ".join(f"the {role}'s max_position_embeddings={limit}" for role, limit in above)
    reach = (f"this run's requests reach {longest} positions" if longest <= min(lim for _, lim in above)
             else f"requests reach {longest} positions (engine.allow_long_max_model_len=true)")
    return [f"engine.max_model_len={engine.max_model_len} > {named}; {reach}"]


def _check_kv_blocks(prompts: list, max_new_tokens: int, engine, k: int) -> None:
    """With an explicit ``engine.num_kv_blocks``, every request must fit the cache (the native scheduler's
    rule: its final length plus 2k+1 draft slots, in blocks of ``block_size``)."""
    num_blocks = engine.options.get("num_kv_blocks")
    if num_blocks is None:
        return
    lookahead = 2 * k + 1 if k > 0 else 0
    for p in prompts:
        final = min(len(p.token_ids) + max_new_tokens, engine.max_model_len) + lookahead
        need = -(-final // engine.block_size)
        if need > num_blocks:
            raise ConfigError(f"prompt '{p.id}' needs {need} KV blocks of {engine.block_size} tokens, more than"
                              f" engine.num_kv_blocks={num_blocks}: raise it, or lower max_new_tokens")


# engine.max_model_len=auto where neither model states max_position_embeddings.
AUTO_MAX_MODEL_LEN_FALLBACK = 4096


def auto_length_budget(pair, k: int, allow_long: bool) -> int:
    """The most positions ``engine.max_model_len=auto`` may give: the smallest max_position_embeddings of the
    models that run (the draft only when k > 0), else :data:`AUTO_MAX_MODEL_LEN_FALLBACK`; with
    ``engine.allow_long_max_model_len`` no less than the fallback either."""
    models = [pair.target] + ([pair.draft] if k > 0 else [])
    limits = [m.max_position_embeddings for m in models if m.max_position_embeddings]
    budget = min(limits) if limits else AUTO_MAX_MODEL_LEN_FALLBACK
    return max(budget, AUTO_MAX_MODEL_LEN_FALLBACK) if allow_long else budget


def auto_max_model_len(prompts: list, max_new_tokens: int, k: int, block_size: int, budget: int) -> int:
    """``engine.max_model_len=auto`` (tokens per request): the longest prompt + ``max_new_tokens`` + ``k``
    (room for the last step's drafts), rounded up to a multiple of ``block_size``, at most ``budget``. A workload
    with later conversation turns keeps ``budget``: a later turn quotes answers not generated yet."""
    if not prompts or any(getattr(p, "num_turns", 1) > 1 for p in prompts):
        return budget
    longest = max(len(p.token_ids) for p in prompts) + max_new_tokens + k
    return min(-(-max(longest, k + 2) // block_size) * block_size, budget)


@functools.lru_cache(maxsize=16)
def _check_tokenizer(path: str, mtime: float, role: str) -> None:
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for any unreadable file
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{role} tokenizer {path} cannot be read ({reason}): is it a tokenizer.json?") from None


def _load_prompts(workload, target, max_prompt_tokens: int | None, cache: dict | None) -> list:
    """The workload's prompts, tokenized with the target's tokenizer (chat template from the target's directory;
    at most ``max_prompt_tokens`` tokens each where the workload truncates), memoised in ``cache``."""
    from specexp.workloads import load_prompts, resolve_workload_path

    if workload.path:
        text_files.check_utf8(resolve_workload_path(str(workload.path)), "workload.path")
    key = (repr(sorted(dataclasses.asdict(workload).items())), target.tokenizer_path, target.vocab_size,
           max_prompt_tokens)
    if cache is not None and key in cache:
        return cache[key]
    try:
        prompts = load_prompts(workload, target.tokenizer_path, target.vocab_size, model_dir=target.path,
                               max_prompt_tokens=max_prompt_tokens)
    except UnicodeDecodeError as e:
        raise ConfigError(f"workload file {workload.path} is not UTF-8 ({e.reason} at byte {e.start}):"
                          " save it as UTF-8") from None
    if cache is not None:
        cache[key] = prompts
    return prompts


def build_run_spec(cfg: dict, ctx, choices: dict | None = None, prompt_cache: dict | None = None):
    """Validate the resolved config ``cfg`` and build the :class:`specexp.specs.RunSpec` (models resolved and
    checked, prompts tokenized). Every check is made here, for every backend alike, and raises
    :class:`ConfigError` before any backend module or model is loaded; nothing is written.
    ``choices``: the options chosen per group (default ``ctx.choices``); ``prompt_cache``: a dict to reuse
    tokenized prompts across calls (the CLI checks every job of a sweep before the first starts). ``ctx``: the
    run's :class:`specexp.experiment.RunContext` (its directory is only named, never touched)."""
    from specexp import config_schema, pairs, specs
    from specexp.backends import check_backend_name
    from specexp.cli import conf_dir
    from specexp.engine_settings import check_engine_settings

    config_schema.check_config(cfg, conf_dir(), choices if choices is not None else ctx.choices)
    check_backend_name(cfg["backend"]["name"])
    _check_device(cfg["engine"]["device"])
    pair_cfg = cfg["pair"]
    target = pairs.describe_model(str(pair_cfg["target"]["path"]), pair_cfg["weights"], "target")
    draft = pairs.describe_model(str(pair_cfg["draft"]["path"]), pair_cfg["weights"], "draft")
    pairs.check_same_tokenizer(target, draft)
    pair = specs.PairSpec(
        name=pair_cfg.get("name", "pair"), target=target, draft=draft, weights=pair_cfg["weights"],
        dtype=pair_cfg["dtype"], init_seed=pair_cfg.get("init_seed", cfg["engine"]["seed"]),
    )
    workload_cfg = dict(cfg["workload"])
    if workload_cfg.get("num_prompts") == "all":
        workload_cfg["num_prompts"] = None
    workload = specs.group_spec(specs.WorkloadSpec, workload_cfg)
    sampling = specs.group_spec(specs.SamplingSpec, cfg["sampling"])
    if workload.name == "random":  # the latency workload: exactly output_len tokens per request
        sampling = dataclasses.replace(sampling, max_new_tokens=workload.output_len or sampling.max_new_tokens,
                                       ignore_eos=True)
    engine = specs.group_spec(specs.EngineSpec, cfg["engine"])
    speculator = specs.group_spec(specs.SpeculatorSpec, cfg["speculator"])
    backend_cfg = dict(cfg["backend"])
    spec = specs.RunSpec(
        experiment=ctx.experiment,
        backend=backend_cfg.pop("name"),
        pair=pair,
        speculator=speculator,
        short_conv=specs.group_spec(specs.ShortConvSpec, cfg.get("short_conv")),
        engine=engine,
        sampling=sampling,
        workload=workload,
        prompts=[],
        output_dir=str(ctx.run_dir),
        config=cfg,
        backend_options=backend_cfg,
    )
    k = speculator.num_speculative_tokens
    auto_length = engine.max_model_len == "auto"
    if auto_length:  # prompts are filtered against the models' limit, then the length is fitted to them
        engine.max_model_len = auto_length_budget(pair, k, bool(engine.options.get("allow_long_max_model_len")))
    check_engine_settings(spec)
    _check_backend_support(spec.backend, speculator, engine)
    for role, model in (("target", target), ("draft", draft)):
        if model.tokenizer_path:
            _check_tokenizer(model.tokenizer_path, Path(model.tokenizer_path).stat().st_mtime, role)
    from specexp.workloads.benchmarks import resolve_max_prompt_tokens

    max_prompt_tokens = resolve_max_prompt_tokens(workload.options.get("max_prompt_tokens"), engine.max_model_len,
                                                  sampling.max_new_tokens)
    spec.prompts = _load_prompts(workload, target, max_prompt_tokens, prompt_cache)
    if auto_length:
        engine.max_model_len = auto_max_model_len(spec.prompts, sampling.max_new_tokens, k, engine.block_size,
                                                  engine.max_model_len)
        check_engine_settings(spec)
    spec.warnings = _check_positions(pair, k, spec.prompts, sampling.max_new_tokens, engine)
    _check_prompt_lengths(spec.prompts, sampling.max_new_tokens, engine.max_model_len)
    _check_kv_blocks(spec.prompts, sampling.max_new_tokens, engine, k)
    spec.arrivals = _arrivals(spec)
    slo = cfg.get("slo") or {}
    spec.slo = specs.SloSpec(ttft_ms=slo.get("ttft_ms"), tpot_ms=slo.get("tpot_ms"))
    return spec


def _arrivals(spec):
    """The run's arrival schedule (:mod:`specexp.workloads.arrivals`), checked against the backend and the
    workload: arrivals other than a burst need single-turn prompts served together."""
    from specexp.workloads.arrivals import arrival_schedule, check_backend_arrivals

    schedule = arrival_schedule(spec.workload, len(spec.prompts))
    check_backend_arrivals(spec.backend, schedule, BACKEND_ARRIVALS.get(spec.backend, ("burst",)))
    if not schedule.is_burst:
        multi_turn = next((p for p in spec.prompts if p.num_turns > 1), None)
        if multi_turn is not None:
            raise ConfigError(f"workload.arrival={schedule.kind} needs single-turn prompts, and '{multi_turn.id}'"
                              f" has {multi_turn.num_turns} turns (a later turn starts when the one before ends):"
                              " use workload.arrival=burst")
        if spec.workload.options.get("one_at_a_time", False):
            raise ConfigError(f"workload.arrival={schedule.kind} and workload.one_at_a_time=true both set when"
                              " requests arrive: drop one of them")
    return schedule
