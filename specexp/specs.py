"""Plain-dataclass run specification handed to a backend: ``backend.run(spec: RunSpec) -> RunResult``.

The app layer (:mod:`specexp.experiment`) builds a :class:`RunSpec` from the composed Hydra config, after
resolving model directories, validating every value and tokenizing the workload; backends never see Hydra
or OmegaConf. Which keys a group may hold and what their values may be is :mod:`specexp.config_schema`'s
job (checked before a spec is built); a valid key that is not a field here lands in the group's
``options``, so a backend can read a new config key before this module grows a field for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specexp.workloads.prompt import Prompt

WEIGHTS = ("auto", "trained", "random")
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
CUDAGRAPH_MODES = ("none", "full")


@dataclass
class ModelSpec:
    """One checkpoint. ``path``: the resolved local directory holding config.json; ``source``: what the config
    named (a directory, a zoo name or a hub id); ``tokenizer_path``: its tokenizer.json, ``None`` if it ships
    none. ``weights``: what this model gets, ``"trained"`` (its safetensors) or ``"random"`` (seeded init),
    as ``PairSpec.weights`` resolved for this directory; ``weights_note`` says why.
    ``max_position_embeddings``: positions the model was trained for (config.json); ``num_conv_layers``: its
    short-conv layers (LFM2), 0 for attention-only models."""

    path: str
    source: str
    architecture: str
    vocab_size: int
    tokenizer_path: str | None = None
    weights: str = "trained"
    weights_note: str = ""
    max_position_embeddings: int | None = None
    num_conv_layers: int = 0


@dataclass
class PairSpec:
    """A draft/target pair. ``weights``: what the config asked for (``auto`` | ``trained`` | ``random``); each
    model's ``ModelSpec.weights`` is what it gets (random weights are seeded with ``init_seed``); ``dtype``
    is a torch dtype name."""

    name: str
    target: ModelSpec
    draft: ModelSpec
    weights: str = "auto"
    dtype: str = "float32"
    init_seed: int = 0


@dataclass
class SpeculatorSpec:
    """``num_speculative_tokens`` (k): draft tokens per verification; 0 = no speculation.
    ``cudagraph_mode``: the draft's graphs, ``None`` = follow ``engine.cudagraph_mode`` (:meth:`draft_graph_mode`)."""

    num_speculative_tokens: int = 0
    cudagraph_mode: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def draft_graph_mode(self, engine_mode: str) -> str:
        """The draft's effective CUDA-graph mode: its own when set, else the engine's; never graphs when the
        engine is eager."""
        if engine_mode == "none":
            return "none"
        return self.cudagraph_mode or engine_mode


@dataclass
class ShortConvSpec:
    use_full_cuda_graph: bool = False
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineSpec:
    """Engine limits. ``max_model_len``: prompt + output tokens per request (``"auto"`` until
    :func:`specexp.run_spec.build_run_spec` fits it to the prompts); ``block_size``: KV-cache
    tokens per block; ``seed``: seeds sampling (and random weights)."""

    device: str = "cpu"
    max_num_seqs: int = 8
    max_model_len: int | str = 2048
    block_size: int = 16
    cudagraph_mode: str = "none"
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class SamplingSpec:
    """``temperature`` 0 = greedy. ``max_new_tokens``: output tokens per request; ``ignore_eos``: keep
    generating past EOS (latency workloads)."""

    temperature: float = 0.0
    max_new_tokens: int = 64
    ignore_eos: bool = False
    top_p: float = 1.0
    top_k: int = 0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkloadSpec:
    """Where the prompts came from (the prompts themselves are ``RunSpec.prompts``) and how they arrive
    (``arrival``, ``request_rate``, ``max_concurrency``, ``arrival_path``: :mod:`specexp.workloads.arrivals`,
    resolved into ``RunSpec.arrivals``)."""

    name: str
    path: str | None = None
    num_prompts: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    seed: int = 0
    arrival: str = "burst"
    request_rate: float | None = None
    max_concurrency: int | None = None
    arrival_path: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SloSpec:
    """Service-level objectives a request must meet to count towards goodput (``slo.*``): time to first token
    and time per output token, in ms; ``None`` = no objective on that latency."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None


@dataclass
class RunSpec:
    """One run: a pair x a speculator setting x an engine setting x a workload, on one backend.

    ``prompts`` are already tokenized with the target's tokenizer.json; ``output_dir`` is the run's
    directory (backends may write extra files there); ``config`` is the resolved config as a plain dict.
    """

    experiment: str
    backend: str
    pair: PairSpec
    speculator: SpeculatorSpec
    short_conv: ShortConvSpec
    engine: EngineSpec
    sampling: SamplingSpec
    workload: WorkloadSpec
    prompts: list[Prompt]
    output_dir: str
    config: dict[str, Any] = field(default_factory=dict)
    backend_options: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # one line each, printed when the run starts
    # When the prompts arrive (a specexp.workloads.arrivals.ArrivalSchedule; None = all at once).
    arrivals: Any = None
    slo: SloSpec = field(default_factory=SloSpec)


def group_spec(cls: type, values: dict[str, Any] | None, **overrides: Any):
    """Build dataclass ``cls`` from a config group's dict: known keys become fields, the rest ``options``."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {**(values or {}), **overrides}
    known = {k: v for k, v in values.items() if k in names and k != "options"}
    if "options" in names:
        known["options"] = {k: v for k, v in values.items() if k not in names}
    return cls(**known)
