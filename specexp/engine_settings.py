"""A RunSpec's engine, speculator and sampling values as the native engine's plain configs, and their check.

:func:`engine_configs` is how the native backend builds its engine. :func:`check_engine_settings` runs the
engine's own validation on the same configs for every backend, before any backend module or model loads,
so a value the engine refuses (k beyond what ``engine.max_model_len`` allows, a Triton kernel without CUDA,
prefill graph sizes beyond a step's budget) gives one line, the same whichever backend was chosen.
"""

from __future__ import annotations

from specexp.errors import ConfigError


def _int_tuple(values) -> tuple | None:
    """A config list as a tuple (None stays None; the engine's validation names bad entries)."""
    if values is None:
        return None
    return tuple(values) if isinstance(values, (list, tuple)) else (values,)


def _float_tuple(values) -> tuple | None:
    """A config list of numbers as a tuple (None stays None; entries are checked by the engine)."""
    if values is None:
        return None
    return tuple(values) if isinstance(values, (list, tuple)) else (values,)


def engine_configs(spec):
    """``(EngineConfig, SpeculatorConfig, SamplingConfig)`` of a :class:`specexp.specs.RunSpec` (keys that are
    not spec fields come through each group's ``options``)."""
    from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig

    e, s, sp = spec.engine, spec.speculator, spec.sampling
    engine = EngineConfig(
        device=e.device, dtype=spec.pair.dtype, max_num_seqs=e.max_num_seqs, max_model_len=e.max_model_len,
        max_num_batched_tokens=e.options.get("max_num_batched_tokens"), block_size=e.block_size,
        num_kv_blocks=e.options.get("num_kv_blocks"), cudagraph_mode=e.cudagraph_mode, seed=e.seed,
        cudagraph_capture_sizes=_int_tuple(e.options.get("cudagraph_capture_sizes")),
        cudagraph_seq_len_buckets=_int_tuple(e.options.get("cudagraph_seq_len_buckets")),
        cudagraph_prefill_tokens=_int_tuple(e.options.get("cudagraph_prefill_tokens")) or (),
        **{name: e.options.get(name, getattr(EngineConfig, name))  # absent: EngineConfig's own defaults
           for name in ("compile_pointwise", "linear_kernel", "silu_in_down_gemv", "silu_in_gate_up",
                        "fold_norm_weights", "attention_kernel", "conv_kernel", "argmax_kernel", "sampler_kernel",
                        "draft_step_kernel", "programmatic_launch", "gemv_early_launch", "skinny_early_launch",
                        "plain_decode_lookahead", "steady_inputs_on_device", "launch_graphs", "cudagraph_shared_pool",
                        "cudagraph_mixed", "draft_prefill_region")},
    )
    speculator = SpeculatorConfig(
        num_speculative_tokens=s.num_speculative_tokens, rejection=s.options.get("rejection", "standard"),
        synthetic_acceptance_rate=float(s.options.get("synthetic_acceptance_rate", 0.7)),
        synthetic_acceptance_rates=_float_tuple(s.options.get("synthetic_acceptance_rates")),
        synthetic_acceptance_length=s.options.get("synthetic_acceptance_length"),
        cudagraph_mode=s.draft_graph_mode(e.cudagraph_mode),
        # the depth of each step (specexp.engine.depth): the engine's validation names a bad entry
        num_speculative_tokens_per_batch_size=s.options.get("num_speculative_tokens_per_batch_size"),
        draft_confidence_threshold=s.options.get("draft_confidence_threshold", 0.0),
        adaptive=s.options.get("adaptive", "off"),
        **{name: s.options.get(name, getattr(SpeculatorConfig, name))  # absent: the estimator's defaults
           for name in ("goodput_prior_acceptance", "goodput_ema_weight")},
        cudagraph_num_speculative_tokens=_int_tuple(s.options.get("cudagraph_num_speculative_tokens")),
    )
    sampling = SamplingConfig(
        temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, max_new_tokens=sp.max_new_tokens,
        ignore_eos=sp.ignore_eos,
    )
    return engine, speculator, sampling


def check_engine_settings(spec) -> None:
    """The engine's own validation of ``spec``'s values, as one-line :class:`ConfigError`s (loads nothing): the
    settings alone, then those the draft's layers decide (`engine.draft_prefill_region`)."""
    from specexp.engine.config import EngineConfigError
    from specexp.engine.draft_catch_up import takes_last_two

    engine, speculator, sampling = engine_configs(spec)
    try:
        engine.validate()
        speculator.validate(engine.max_model_len)
        sampling.validate()
        if speculator.num_speculative_tokens > 0:
            takes_last_two(engine.draft_prefill_region, spec.pair.draft.num_conv_layers > 0)
    except EngineConfigError as e:
        raise ConfigError(str(e)) from None
