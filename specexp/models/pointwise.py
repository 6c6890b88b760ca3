"""The elementwise pieces of a decoder layer (RMSNorm, the SiLU-gated product, rotary embedding and its tables, the
short conv's multiply-adds) as plain functions, and the same functions fused by torch.compile.

Modules call them through a `PointwiseOps` table (`module.ops`, :data:`EAGER` by default). At batch 1 a
captured decode step is bound by its kernel count rather than by weight bytes
(`experiments/2026-11-29-cudagraphs-h200/`), and eagerly each of these runs 2–4 kernels. Compiled
(`engine.compile_pointwise=true`, or :func:`use_pointwise_ops` with :func:`compiled_pointwise_ops`), each
becomes one generated kernel (Triton on a GPU, C++ on a CPU), and the engine's CUDA graphs capture it like
any other kernel. vLLM fuses the same ops with torch.compile.

Numerics: `emulate_precision_casts` keeps eager's half-precision roundings. The compiled RoPE and SiLU
product are bitwise eager's; so is RMSNorm in half precision on the CPU. An fp32 RMSNorm may differ in the
last bit (reduction order). The compiled variants compile on first use for each dtype, with symbolic sizes.
The engine's warm-up before every capture makes that first use, so nothing compiles inside a capture.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specexp.models.kernels import set_on_modules
from specexp.models.short_conv_ops import conv_taps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)) over the last dim; x [..., d], weight [d].

    fp32: one fused op, (x * rstd) * weight; on the CPU :func:`rms_norm_cpu`, which computes the same in fewer
    kernels. Half precision: normalised in fp32 and rounded once to x's dtype (rms_norm on a half tensor computes
    in fp32 inside), then scaled by the weight — transformers' rounding, which a fused fp32 scale would not
    reproduce. Mixed dtypes: normalise `x.float()`, cast back, scale.
    """
    if x.dtype == weight.dtype == torch.float32:
        if x.device.type == "cpu":
            return rms_norm_cpu(x, weight, eps)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    if x.dtype in (torch.float16, torch.bfloat16):
        return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)
    return weight * F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps).to(x.dtype)


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`rms_norm` of fp32 CPU tensors as one LayerNorm: x [..., d] -> [..., d].

    The row z = [x, -x] has mean 0 and variance mean(x^2), so LayerNorm(z)[:d] = x / sqrt(mean(x^2) + eps): the
    same function, equal to F.rms_norm up to rounding (the two sum in different orders; a few ulp). Why: on a
    CPU F.rms_norm runs as about eight kernels (pow, mean, add, rsqrt, two multiplies, casts) while LayerNorm has
    a fused one. At the demo pair's sizes (rows of 128-256) a kernel costs microseconds whatever its size, and a
    decode step normalises twice per layer.
    """
    d = x.shape[-1]
    return F.layer_norm(torch.cat((x, x.neg()), dim=-1), (2 * d,), eps=eps)[..., :d] * weight


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise; gate, up [T, I]."""
    return F.silu(gate) * up


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding, transformers' `x * cos + rotate_half(x) * sin` with rotate_half's sign
    moved into signed_sin (the same values: a sign flip is exact). x: [T, heads, head_dim]; cos/signed_sin:
    [T, head_dim] from `RotaryEmbedding`."""
    swapped = x.roll(x.shape[-1] // 2, dims=-1)  # [x[D/2:], x[:D/2]], one op
    return x * cos.unsqueeze(1) + swapped * signed_sin.unsqueeze(1)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables of a flat batch of positions: positions int64[T], inv_freq fp32[D/2] (radians per
    position) -> (cos, signed_sin), each [T, D] in `dtype`: cos = [cos f, cos f], signed_sin = [-sin f, sin f]
    with f = position * inv_freq in fp32 (rotate-half's sign folded in, see :func:`apply_rope`). Eagerly nine
    small kernels a forward; compiled, two on a GPU; none in a forward whose attention kernel computes the angles
    itself (:class:`specexp.models.rope.RopeTables` makes them only when read)."""
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq.float()
    return torch.cat((freqs, freqs), dim=-1).cos().to(dtype), torch.cat((-freqs, freqs), dim=-1).sin().to(dtype)


@dataclass(frozen=True)
class PointwiseOps:
    """The implementations modules call: `rms_norm(x, weight, eps)`, `silu_mul(gate, up)`,
    `apply_rope(x, cos, signed_sin)`, `rope_tables(positions, inv_freq, dtype)` (this module's functions) and
    `conv_taps(ext, weight, query_len)` (the short conv's multiply-adds, `specexp.models.short_conv_ops.conv_taps`)."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    apply_rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    conv_taps: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    rope_tables: Callable[[torch.Tensor, torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = rope_tables


EAGER = PointwiseOps(rms_norm, silu_mul, apply_rope, conv_taps, rope_tables)


# Variants each compiled function may need in one process: dtype x rank (RMSNorm also runs per head) x eps
# (target and draft may differ) x size-1 specialisations x grad mode (tests call models outside
# inference_mode) — more than dynamo's default limit of 8, beyond which a fullgraph compile fails hard.
RECOMPILE_LIMIT = 64


@functools.cache
def compiled_pointwise_ops() -> PointwiseOps:
    """The same three functions, each compiled by inductor into one fused kernel (compiled lazily per variant;
    sizes are symbolic). Raises dynamo's process-wide recompile limit to at least RECOMPILE_LIMIT."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)

    def compile_(fn):
        return torch.compile(fn, dynamic=True, fullgraph=True, options={"emulate_precision_casts": True})

    return PointwiseOps(compile_(rms_norm), compile_(silu_mul), compile_(apply_rope), compile_(conv_taps),
                        compile_(rope_tables))


def use_pointwise_ops(model: nn.Module, ops: PointwiseOps) -> None:
    """Make every module of `model` that calls pointwise ops (those with an `ops` table) call `ops`."""
    set_on_modules(model, "ops", ops)
