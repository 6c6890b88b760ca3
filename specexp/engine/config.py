"""Plain configuration dataclasses of the native engine (built from the Hydra config by the app layer)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specexp.engine.draft_advance import DRAFT_STEP_KERNELS
from specexp.engine.errors import EngineConfigError
from specexp.engine.goodput import GoodputSettings
from specexp.engine.sampling import ARGMAX_KERNELS, TRITON_ARGMAX_KERNELS
from specexp.models import skinny_configs, triton_support
from specexp.models.attention import ATTENTION_KERNELS
from specexp.models.linear_ops import LINEAR_KERNELS
from specexp.models.short_conv_ops import CONV_KERNELS

# engine.cudagraph_mixed: how mixed prefill+verify steps replay (see EngineConfig).
MIXED_STEP_MODES = ("joined", "parts")
# An engine's two models, as settings that apply to one of them name them (see EngineConfig).
MODEL_ROLES = ("target", "draft")
# engine.gemv_early_launch / skinny_early_launch: whose one-row GEMVs / skinny kernels launch early (see
# EngineConfig).
EARLY_LAUNCH_ROLES = ("both", *MODEL_ROLES, "none")
# engine.draft_prefill_region: the draft's prefill regions of verify rows (see EngineConfig).
DRAFT_PREFILL_REGIONS = ("auto", "full", "last_two")


@dataclass(frozen=True)
class EngineConfig:
    """Sizes and switches of one engine instance.

    max_num_seqs: requests decoded together (rows of a step).
    max_model_len: prompt + output tokens of one request, at most.
    max_num_batched_tokens: tokens of one step (prefill chunks are cut to fit); None = max_model_len * 2.
    block_size: tokens per KV-cache block. num_kv_blocks: None = enough for max_num_seqs full requests.
    cudagraph_mode: "none" | "full". On a CPU, "full" compiles each step graph's function with torch.compile at
    start-up and calls it where a GPU replays the graph (`specexp.engine.compiled_graphs`; needs a C++ compiler).
    cudagraph_capture_sizes: row counts to capture, one above max_num_seqs counted as max_num_seqs (None = 1, 2,
    4, ... max_num_seqs).
    cudagraph_seq_len_buckets: key lengths (tokens) each size is captured at; a step replays the smallest
    bucket holding its longest row (None = 256, 512, ... and the longest a request can reach).
    cudagraph_prefill_tokens: token counts of one-request prompt prefills to capture as target graphs, e.g.
    (64, 128, 256): a step that prefills a single request (batch-1 serving: the prompt's time to first token)
    pads its chunk to the smallest count that holds it and replays that graph instead of running eagerly, host
    bound; () = off (the default). The draft's prefill of the chunk (its tokens + the sampled one) replays a
    graph of count + 1 slots likewise. Attention-only, short-conv and hybrid models alike (a short-conv layer
    reads the chunk's conv-state slot from the builder's one-row persistent buffers); each count must fit a
    step (max_num_batched_tokens).
    cudagraph_mixed: how a step that puts prompt chunks beside verify rows of one length replays, when prompt
    graphs exist: "joined" (the default) captures, per chunk shape (M rows of C slots: C a prompt-graph count,
    M = 1, 2, 4, ... up to the chunks a step's budget holds) and verify (rows, k) key, one target graph of both,
    so the target reads its weights once (`specexp.engine.mixed_graphs`), and the draft's prefill likewise;
    "parts" replays the verify graph and then each chunk's prompt graph (`specexp.engine.mixed_steps`), which
    captures nothing more. Steps a joined graph does not hold (chunks of no captured shape, more verify rows than
    it has) run in parts either way.
    cudagraph_shared_pool: capture every graph of the engine, target and draft, into one memory pool (vLLM's
    way: one process-wide pool), so the graph memory is about the largest graph's intermediates rather than the
    sum over managers (the default). False: a pool per manager (each model's prompt-prefill managers share one).
    compile_pointwise: fuse each RMSNorm, SiLU-gated product, RoPE and short-conv multiply-add chain of the
    target and draft into one torch.compile'd kernel (`specexp.models.pointwise`; needs a compiler for
    inductor's backend: Triton on a GPU, a C++ compiler on a CPU). Off: plain eager torch. With CUDA graphs
    the fused kernels are what the graphs capture; steps that run eagerly (prefills, mixed batches) call the
    plain ops, as a compiled function's Python dispatch costs the host more than the launches it saves.
    linear_kernel: "cublas" (torch's GEMMs for every projection) | "triton_gemv" (single-token projections,
    i.e. batch-1 decode and draft steps, on the Triton GEMV of `specexp.models.triton_gemv`; CUDA only) |
    "triton_skinny" (the same, and projections of up to 16 tokens, e.g. a batch-1 verify, on its skinny GEMM;
    with fold_norm_weights it beats cuBLAS + separate norms inside the engine on the H200, see `triton_gemv`'s
    docstring; `engine=cuda`'s default).
    silu_in_down_gemv: with a Triton linear_kernel, compute a gated MLP's SiLU product of one token inside its
    down projection's GEMV (`triton_gemv.gated_gemv`): one kernel fewer per layer of a batch-1 step. (Either way
    a Triton linear_kernel runs the down projection itself on its own kernels.)
    silu_in_gate_up: true | false | "target" | "draft": with linear_kernel=triton_skinny, compute a gated MLP's
    SiLU product of 2-16 tokens (a batch-1 verify, a draft prefill region) in its gate/up projection's skinny kernel
    (`triton_gemv.gate_up_silu`), in both models (true) or one: one kernel fewer per layer of such a step. It pays
    where the skinny kernels run in stream order (`skinny_early_launch`); `engine=cuda` fuses it in the target.
    fold_norm_weights: fold each decoder layer's pre-norm weight into the projections that read it, in place
    (`specexp.models.norm_folding`: the same function up to one rounding of each folded weight), so the Triton
    kernels that fuse the norm skip scaling x by it; the models stay folded after the engine.
    attention_kernel: "sdpa" (gather each row's keys, then SDPA) | "triton" (uniform batches, i.e. decode
    and verify steps, on one Triton kernel reading the paged cache in place, `specexp.models.triton_attention`;
    CUDA only; other batches keep SDPA).
    conv_kernel: "torch" | "triton" (LFM2's gated short conv in one Triton kernel per layer for uniform batches and
    for batches of non-spec rows alone, e.g. prompt chunks, `specexp.models.triton_short_conv`; CUDA only; batches
    mixing spec and non-spec rows keep the torch path).
    argmax_kernel: "torch" | "triton" | "triton_two_launches" (the argmax over the vocabulary of greedy drafting,
    greedy verification and sampling's exponential race in one short Triton launch, `specexp.models.triton_argmax`,
    which with sampler_kernel=triton verifies too: the same indices as torch's, where torch reduces a batch-1 row
    of 128K logits in one block; "triton_two_launches": the argmax in two launches and the verification in its
    own, the baseline of the one-launch paths; CUDA only).
    sampler_kernel: "torch" | "triton" (greedy runs: from the target's argmax to each row's emitted tokens in one
    Triton kernel, `specexp.engine.triton_verify`, the same tokens as the torch path's ~20 small kernels; sampled
    runs keep the torch path; CUDA only).
    draft_step_kernel: "torch" | "triton" (between the draft's decode steps, each row's next input, position,
    seq_len and KV slot in one Triton kernel, `specexp.engine.triton_draft_step`, where torch runs about eleven
    small kernels a step; before its prefill, the regions' input ids from the verify in one kernel where torch
    runs about fifteen; CUDA only).
    programmatic_launch: true | false | "auto". On a GPU of compute capability 9.0+ (Hopper), launch the Triton
    kernels of the linear, attention and conv settings (GEMV, skinny GEMM, decode/verify attention, uniform short
    conv) with programmatic dependent launch: each may start while the kernel before it finishes and waits for it
    in-kernel; a GEMV fetches its first weight chunk before it waits (`triton_gemv.gemv`'s `pdl`). The same
    values; what it saves is part of each launch's gap in a chain of short kernels (a batch-1 step). true demands
    it (an older GPU is an error); "auto" launches early where the GPU, the Triton and a Triton kernel setting
    allow, and plainly elsewhere (`launches_early`).
    gemv_early_launch: "both" | "target" | "draft" | "none": with programmatic launch on, whose one-row GEMVs (a
    batch-1 decode step's products, the LM head's included) launch early; the others run in stream order. On an
    H200 a 1B target's chain of norm-fused GEMVs alone ran 7% faster in order, a 100M draft's 21% slower
    (`experiments/2026-12-06-sweep-time-h200/`); on an H100 both models' whole steps ran slower in order (the
    Llama-1B target 1.163 against 1.099 ms, its draft 0.235 against 0.175;
    `experiments/2026-12-07-step-kernels-h100/`).
    skinny_early_launch: "both" | "target" | "draft" | "none": with programmatic launch on, whose skinny kernels
    (products of 2-16 tokens: the target's verify, the draft's prefill) launch early too; the others run in stream
    order. An early-launched kernel holds its blocks' registers and shared memory while it waits: the long
    skinny products of a 1B target's verify ran faster in order, the short ones of a 100M draft's prefill slower
    (H100 figures in `experiments/2026-12-06-verify-launch-order-h100/`); `engine=cuda` launches the draft's early.
    plain_decode_lookahead: without speculation (k = 0), queue each step before the last one's tokens are read
    back (a step emits one token a row, so everything but the token's value is known; the device gathers it):
    the host's work for a step overlaps the device's previous step. A request that stops at EOS costs one
    discarded row. With speculation the host's work overlaps the draft instead (always on).
    steady_inputs_on_device: a graph-replayed step over the same rows as the step before (each one step further,
    no prompt row) is staged by one kernel on the device from what the last step accepted
    (`specexp.engine.verify_advance`) instead of from the host after the read-back: the host's staging, which the
    device waits for when the draft is shorter, leaves the path between the read-back and the next verify.
    launch_graphs: on a GPU, replay that advance kernel's launch from one small CUDA graph per (rows, tokens,
    drafting) (`specexp.engine.launch_graphs`): a launch from Python costs the host tens of µs on the path from
    the read-back to the next verify, a replay a few. false: launched from Python every step (the baseline
    `benchmarks/diagnostics/host_time.py --eager-launches` compares against).
    draft_prefill_region: "auto" | "full" | "last_two": the draft's prefill after a verify of v drafts, over each
    row's v + 2 slots from t_last ("full": the verified inputs kept, the new token, padding) or over the last two
    (the last accepted input and the new token, `specexp.engine.draft_catch_up`): an attention-only draft's cache
    already holds the rest, so the prefill runs 2 tokens a row at every v, one graph a batch size for every k.
    "auto": last_two for drafts without short-conv layers, whose conv state needs the full region. Prompt rows,
    and verify rows beside prompt chunks in one joined graph, keep the full region either way.
    """

    device: str = "cpu"
    dtype: str = "float32"
    max_num_seqs: int = 8
    max_model_len: int = 512
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    cudagraph_mode: str = "none"
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    cudagraph_seq_len_buckets: tuple[int, ...] | None = None
    cudagraph_prefill_tokens: tuple[int, ...] = ()
    cudagraph_mixed: str = "joined"
    cudagraph_shared_pool: bool = True
    compile_pointwise: bool = False
    linear_kernel: str = "cublas"
    silu_in_down_gemv: bool = False
    silu_in_gate_up: bool | str = False
    fold_norm_weights: bool = False
    attention_kernel: str = "sdpa"
    conv_kernel: str = "torch"
    argmax_kernel: str = "torch"
    sampler_kernel: str = "torch"
    draft_step_kernel: str = "torch"
    programmatic_launch: bool | str = False
    gemv_early_launch: str = "both"
    skinny_early_launch: str = "both"
    plain_decode_lookahead: bool = True
    steady_inputs_on_device: bool = True
    launch_graphs: bool = True
    draft_prefill_region: str = "auto"
    seed: int = 0

    def validate(self) -> None:
        if self.max_num_seqs < 1:
            raise EngineConfigError(f"engine.max_num_seqs={self.max_num_seqs}: must be >= 1")
        if self.max_model_len < 2:
            raise EngineConfigError(f"engine.max_model_len={self.max_model_len}: must be >= 2")
        if self.block_size < 1:
            raise EngineConfigError(f"engine.block_size={self.block_size}: must be >= 1")
        if self.cudagraph_mode not in ("none", "full"):
            raise EngineConfigError(f"engine.cudagraph_mode={self.cudagraph_mode!r}: valid are 'none', 'full'")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise EngineConfigError(f"engine.dtype={self.dtype!r}: valid are 'float32', 'bfloat16', 'float16'")
        for name in ("cudagraph_capture_sizes", "cudagraph_seq_len_buckets"):
            values = getattr(self, name)
            if values is not None and (not values or any(not isinstance(v, int) or v < 1 for v in values)):
                raise EngineConfigError(f"engine.{name}={values!r}: must be a non-empty list of integers >= 1 "
                                        "(or null for the defaults)")
        prefill = self.cudagraph_prefill_tokens
        if (not isinstance(prefill, tuple) or any(not isinstance(v, int) or not 1 <= v <= self.token_budget
                                                  for v in prefill)):
            raise EngineConfigError(
                f"engine.cudagraph_prefill_tokens={prefill!r}: must be a list of token counts in [1, "
                f"{self.token_budget}] (a step's token budget, max_num_batched_tokens), or [] for none")
        if self.cudagraph_mixed not in MIXED_STEP_MODES:
            raise EngineConfigError(f"engine.cudagraph_mixed={self.cudagraph_mixed!r}: valid are "
                                    + ", ".join(repr(m) for m in MIXED_STEP_MODES))
        for name in ("compile_pointwise", "plain_decode_lookahead", "fold_norm_weights", "cudagraph_shared_pool",
                     "silu_in_down_gemv", "steady_inputs_on_device", "launch_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise EngineConfigError(f"engine.{name}={getattr(self, name)!r}: must be true or false")
        if self.draft_prefill_region not in DRAFT_PREFILL_REGIONS:
            raise EngineConfigError(f"engine.draft_prefill_region={self.draft_prefill_region!r}: valid are "
                                    + ", ".join(repr(m) for m in DRAFT_PREFILL_REGIONS))
        if not isinstance(self.programmatic_launch, bool) and self.programmatic_launch != "auto":
            raise EngineConfigError(f"engine.programmatic_launch={self.programmatic_launch!r}: must be true, false "
                                    "or auto")
        if not isinstance(self.silu_in_gate_up, bool) and self.silu_in_gate_up not in MODEL_ROLES:
            raise EngineConfigError(f"engine.silu_in_gate_up={self.silu_in_gate_up!r}: must be true, false, target "
                                    "or draft")
        for name in ("gemv_early_launch", "skinny_early_launch"):
            if getattr(self, name) not in EARLY_LAUNCH_ROLES:
                raise EngineConfigError(f"engine.{name}={getattr(self, name)!r}: valid are "
                                        + ", ".join(repr(m) for m in EARLY_LAUNCH_ROLES))
        self._check_kernel("linear_kernel", LINEAR_KERNELS, ("triton_gemv", "triton_skinny"), "cublas")
        if self.linear_kernel == "triton_skinny":
            try:
                skinny_configs.check_source()
            except ValueError as exc:
                raise EngineConfigError(f"engine.linear_kernel=triton_skinny: {exc}") from None
        self._check_kernel("attention_kernel", ATTENTION_KERNELS, ("triton",), "sdpa")
        self._check_kernel("conv_kernel", CONV_KERNELS, ("triton",), "torch")
        self._check_kernel("argmax_kernel", ARGMAX_KERNELS, TRITON_ARGMAX_KERNELS, "torch")
        self._check_kernel("sampler_kernel", ("torch", "triton"), ("triton",), "torch")
        self._check_kernel("draft_step_kernel", DRAFT_STEP_KERNELS, ("triton",), "torch")
        if self.silu_in_down_gemv and self.linear_kernel == "cublas":
            raise EngineConfigError("engine.silu_in_down_gemv=true computes the SiLU product in the Triton GEMV: it "
                                    "needs engine.linear_kernel=triton_gemv or triton_skinny (got 'cublas')")
        if self.silu_in_gate_up and self.linear_kernel != "triton_skinny":
            raise EngineConfigError(f"engine.silu_in_gate_up={str(self.silu_in_gate_up).lower()} computes the SiLU "
                                    "product in the skinny kernel: it needs engine.linear_kernel=triton_skinny (got "
                                    f"{self.linear_kernel!r})")
        if self.programmatic_launch is True and not self._has_triton_kernel():
            raise EngineConfigError("engine.programmatic_launch=true launches the Triton kernels early: it needs one "
                                    "of engine.linear_kernel=triton_gemv|triton_skinny, attention_kernel=triton, "
                                    "conv_kernel=triton (all are torch's now)")
        if self.programmatic_launch is True and not triton_support.HAS_GRID_DEPENDENCY_CONTROL:
            raise EngineConfigError("engine.programmatic_launch=true needs a Triton with grid dependency control "
                                    "(3.4 or later); or set it false")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise EngineConfigError(
                f"engine.max_num_batched_tokens={self.max_num_batched_tokens}: must be >= 1 (or null)"
            )

    def _has_triton_kernel(self) -> bool:
        """Whether a kernel setting that can launch early is a Triton one (linear, attention or conv)."""
        return (self.linear_kernel, self.attention_kernel, self.conv_kernel) != ("cublas", "sdpa", "torch")

    def launches_early(self) -> bool:
        """Whether the engine's Triton kernels are launched with programmatic dependent launch: programmatic_launch
        true, or "auto" on a GPU of compute capability 9.0+ with a Triton that can and a Triton kernel setting."""
        if self.programmatic_launch != "auto":
            return bool(self.programmatic_launch)
        return self._has_triton_kernel() and triton_support.programmatic_launch(torch.device(self.device))

    def _check_kernel(self, name: str, valid, triton_choices: tuple[str, ...], default: str) -> None:
        """engine.<name> is one of `valid`; its Triton choices need CUDA and triton (else `default` is named)."""
        value = getattr(self, name)
        if value not in valid:
            raise EngineConfigError(f"engine.{name}={value!r}: valid are " + ", ".join(repr(k) for k in valid))
        if value in triton_choices and (self.device != "cuda" or not triton_support.AVAILABLE):
            raise EngineConfigError(
                f"engine.{name}={value!r} needs engine.device=cuda (got {self.device!r}) and triton "
                f"(importable: {triton_support.AVAILABLE}; CUDA builds of torch ship it); or use {default!r}"
            )

    @property
    def token_budget(self) -> int:
        return self.max_num_batched_tokens or 2 * self.max_model_len


ADAPTIVE_MODES = ("off", "goodput")


@dataclass(frozen=True)
class SpeculatorConfig:
    """num_speculative_tokens: K, the most drafts per verify (0 = no speculation); it sizes every buffer.
    rejection: "standard" (greedy / Leviathan-Chen sampling) | "synthetic" (accept drafts at a set rate,
    whatever the tokens: measures system cost apart from draft quality). synthetic_acceptance_rate: each
    position's acceptance given the ones before; synthetic_acceptance_rates (unconditional, per position) or
    synthetic_acceptance_length (tokens per verification) replace it (`specexp.engine.synthetic`).
    cudagraph_mode: "none" | "full" for the draft prefill and decode graphs.
    The depth of each step (`specexp.engine.depth`), at most one of: num_speculative_tokens_per_batch_size
    (inclusive [start_bs, end_bs, k] ranges, vLLM 0.33's schedule), draft_confidence_threshold (> 0: a row's
    drafts after its first one whose draft probability is below it are not verified), adaptive ("goodput":
    each step's k maximises its requests' expected tokens per unit of step time, `specexp.engine.goodput`).
    goodput_prior_acceptance, goodput_ema_weight: adaptive goodput's estimator, each request's per-position
    acceptance before any verify and the weight of each verify in its moving average (`GoodputSettings`).
    cudagraph_num_speculative_tokens: the k whose graphs are captured (None: every k the depth policy takes).
    """

    num_speculative_tokens: int = 0
    rejection: str = "standard"
    synthetic_acceptance_rate: float = 0.7
    cudagraph_mode: str = "none"
    num_speculative_tokens_per_batch_size: tuple | None = None
    draft_confidence_threshold: float = 0.0
    adaptive: str = "off"
    goodput_prior_acceptance: float = GoodputSettings.prior_acceptance
    goodput_ema_weight: float = GoodputSettings.ema_weight
    cudagraph_num_speculative_tokens: tuple[int, ...] | None = None

    def goodput_settings(self) -> GoodputSettings:
        """The estimator settings of `adaptive: goodput`."""
        return GoodputSettings(prior_acceptance=self.goodput_prior_acceptance, ema_weight=self.goodput_ema_weight)

    @property
    def depth_modes(self) -> list[str]:
        """The depth settings that are on (at most one is valid)."""
        on = {"num_speculative_tokens_per_batch_size": self.num_speculative_tokens_per_batch_size is not None,
              "draft_confidence_threshold": self.draft_confidence_threshold != 0,
              "adaptive": self.adaptive != "off"}
        return [name for name, is_on in on.items() if is_on]
    synthetic_acceptance_rates: tuple[float, ...] | None = None
    synthetic_acceptance_length: float | None = None

    def synthetic_rates(self) -> list[float]:
        """Unconditional per-position acceptance float[k] of the synthetic sampler (`specexp.engine.synthetic`)."""
        from specexp.engine.synthetic import synthetic_rates

        return synthetic_rates(self.num_speculative_tokens, self.synthetic_acceptance_rate,
                               self.synthetic_acceptance_rates, self.synthetic_acceptance_length)

    def synthetic_conditional_rates(self) -> list[float]:
        """Per position, the synthetic sampler's acceptance given drafts 0..i-1 were accepted, float[k]."""
        from specexp.engine.synthetic import conditional_rates

        if self.synthetic_acceptance_rates is None and self.synthetic_acceptance_length is None:
            return [self.synthetic_acceptance_rate] * self.num_speculative_tokens
        return conditional_rates(self.synthetic_rates())

    def validate(self, max_model_len: int) -> None:
        k = self.num_speculative_tokens
        if k < 0:
            raise EngineConfigError(f"speculator.num_speculative_tokens={k}: must be >= 0 (0 = no speculation)")
        self._validate_depth()
        if k + 2 > max_model_len:
            raise EngineConfigError(
                f"speculator.num_speculative_tokens={k}: engine.max_model_len={max_model_len} leaves room for at "
                f"most {max(max_model_len - 2, 0)} drafts (one prompt token + k drafts + 1 sampled token)"
            )
        if self.rejection not in ("standard", "synthetic"):
            raise EngineConfigError(f"speculator.rejection={self.rejection!r}: valid are 'standard', 'synthetic'")
        if not 0.0 <= self.synthetic_acceptance_rate <= 1.0:
            raise EngineConfigError(
                f"speculator.synthetic_acceptance_rate={self.synthetic_acceptance_rate}: must be in [0, 1]"
            )
        synthetic_forms = (self.synthetic_acceptance_rates, self.synthetic_acceptance_length)
        if self.rejection == "standard" and any(v is not None for v in synthetic_forms):
            name = "rates" if self.synthetic_acceptance_rates is not None else "length"
            raise EngineConfigError(
                f"speculator.synthetic_acceptance_{name} is set but speculator.rejection='standard': set "
                "speculator.rejection=synthetic, or leave it null")
        self.synthetic_rates()
        if self.cudagraph_mode not in ("none", "full"):
            raise EngineConfigError(f"speculator.cudagraph_mode={self.cudagraph_mode!r}: valid are 'none', 'full'")

    def _validate_depth(self) -> None:
        """The depth settings: each valid, at most one on, and only with K >= 1 (one line each)."""
        from specexp.engine.depth import parse_batch_size_schedule

        k = self.num_speculative_tokens
        threshold = self.draft_confidence_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise EngineConfigError(f"speculator.draft_confidence_threshold={threshold!r}: must be in [0, 1] "
                                    "(0 = off)")
        if self.adaptive not in ADAPTIVE_MODES:
            raise EngineConfigError(f"speculator.adaptive={self.adaptive!r}: valid are " +
                                    ", ".join(repr(m) for m in ADAPTIVE_MODES))
        modes = self.depth_modes
        if len(modes) > 1:
            raise EngineConfigError(f"speculator.{modes[0]} and speculator.{modes[1]} are both set: choose one "
                                    "depth mode (a batch-size schedule, a confidence threshold or adaptive)")
        if modes and k == 0:
            raise EngineConfigError(f"speculator.{modes[0]} needs speculator.num_speculative_tokens >= 1 (K, the "
                                    "largest k), got 0")
        if self.num_speculative_tokens_per_batch_size is not None:
            parse_batch_size_schedule(self.num_speculative_tokens_per_batch_size, k)
        self._validate_goodput_settings()
        depths = self.cudagraph_num_speculative_tokens
        if depths is not None and (not isinstance(depths, tuple) or not depths or any(
                not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= k for d in depths)):
            shown = list(depths) if isinstance(depths, tuple) else depths
            raise EngineConfigError(f"speculator.cudagraph_num_speculative_tokens={shown!r}: must be a non-empty "
                                    f"list of k in [0, {k}] (or null: every k the depth policy takes)")

    def _validate_goodput_settings(self) -> None:
        """The goodput estimator's prior in (0, 1) and EMA weight in (0, 1], each set only with adaptive: goodput."""
        checks = (("goodput_prior_acceptance", lambda v: 0 < v < 1, "in (0, 1)"),
                  ("goodput_ema_weight", lambda v: 0 < v <= 1, "in (0, 1]"))
        for name, ok, valid in checks:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise EngineConfigError(f"speculator.{name}={value!r}: must be {valid}")
            default = getattr(GoodputSettings, name.removeprefix("goodput_"))
            if self.adaptive != "goodput" and value != default:
                raise EngineConfigError(f"speculator.{name}={value!r} is set but speculator.adaptive="
                                        f"{self.adaptive!r}: it tunes adaptive goodput (set speculator.adaptive="
                                        f"goodput, or leave it at {default})")


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 = greedy. top_k 0 / top_p 1.0 = off. max_new_tokens per request."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    ignore_eos: bool = False

    def validate(self) -> None:
        if self.temperature < 0:
            raise EngineConfigError(f"sampling.temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise EngineConfigError(f"sampling.top_k={self.top_k}: must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineConfigError(f"sampling.top_p={self.top_p}: must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise EngineConfigError(f"sampling.max_new_tokens={self.max_new_tokens}: must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
