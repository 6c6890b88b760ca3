"""Building blocks shared by the native models: RMSNorm, rotary embeddings, the q/k/v attention core, the
SiLU-gated MLP.

The arithmetic follows transformers' Llama/LFM2 modules operation for operation (same casts, same order),
so fp32 results agree to rounding. Every op is shape-static and sync-free (CUDA-graph capturable).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from specexp.models.attention import SDPA, AttentionPlan, HeadPrologue, attend
from specexp.models.config import RopeConfig
from specexp.models.kernels import UniformKernel
from specexp.models.linear_ops import CUBLAS, LinearOps
from specexp.models.metadata import AttentionMetadata
from specexp.models.pointwise import EAGER, PointwiseOps
from specexp.models.rope import RopeTables
from specexp.models.stacked import StackedLinear


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)) (see :func:`specexp.models.pointwise.rms_norm`).

    `folded`: the weight has been folded into the projections that read this norm and is now all ones
    (:mod:`specexp.models.norm_folding`), so a kernel that fuses the norm may skip the scaling."""

    ops: PointwiseOps = EAGER

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.folded = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] -> [..., dim]."""
        return self.ops.rms_norm(x, self.weight, self.eps)


class TokenEmbedding(nn.Embedding):
    """nn.Embedding (weight [vocab, hidden]) without its N(0, 1) initialisation: a model's weights are always
    loaded or drawn by :func:`specexp.models.loader.init_random_` afterwards. Models are built on the meta
    device, where that initialisation alone imports torch._dynamo: ~1 s of every run's start-up on a CPU."""

    def reset_parameters(self) -> None:
        """Nothing: the weight stays as allocated until loaded."""


def add_projection_(ops: LinearOps, residual: torch.Tensor, x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """residual += linear(x) in place, on `ops`' kernels (:func:`specexp.models.linear_ops.add_linear_`);
    residual [T, out], x [T, in] -> residual."""
    return ops.add_linear_(residual, x, linear.weight, linear.bias)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """float32[head_dim // 2] inverse frequencies (radians per position), on the CPU whatever the default device
    (on the meta device, where models are built, these few ops would import torch._dynamo: ~1 s a process)."""
    positions = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu")
    inv_freq = 1.0 / (rope.theta ** (positions.float() / head_dim))
    if rope.rope_type == "default":
        return inv_freq
    # llama3: long wavelengths slowed down by `factor`, short ones kept, the band between interpolated.
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for a flat batch of positions (computed per step, nothing cached by length).

    `inv_freq` is a float32 buffer; after building a model on the meta device call `reset_inv_freq()`.
    """

    ops: PointwiseOps = EAGER

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        inv_freq = rope_inv_freq(rope, head_dim).to(torch.get_default_device())
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_inv_freq(self) -> None:
        self.inv_freq = rope_inv_freq(self.rope, self.head_dim).to(self.inv_freq.device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        """positions: int64[T] -> the tables (cos, signed_sin), each [T, head_dim] in `dtype`, made when first used:
        cos = [cos f, cos f] and signed_sin = [-sin f, sin f], rotate-half's sign folded in
        (:func:`specexp.models.pointwise.rope_tables`, on this module's `ops`)."""
        return RopeTables(positions, self.inv_freq, dtype, self.ops.rope_tables)


class QKVAttention(nn.Module):
    """The attention core both architectures share: q/k/v projections (transformers' `q_proj`/`k_proj`/
    `v_proj`), optional per-head q/k norms, RoPE and paged attention. Subclasses register their output
    projection and norms under their checkpoint's names (after these, so parameter order is unchanged) and
    apply the output projection to :meth:`attend_heads`."""

    ops: PointwiseOps = EAGER
    linear_ops: LinearOps = CUBLAS
    attention_kernel: UniformKernel = SDPA

    def __init__(self, config, qkv_bias: bool):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        hidden, kv_dim = config.hidden_size, self.num_kv_heads * self.head_dim
        self.q_dim = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, self.q_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_dim, bias=qkv_bias)
        self.qkv = StackedLinear([self.q_proj, self.k_proj, self.v_proj])  # one GEMM; q/k/v params kept

    def attend_heads(self, x: torch.Tensor, input_norm: RMSNorm | None, positions: torch.Tensor,
                     rope: RopeTables, kv_cache: torch.Tensor,
                     meta: AttentionMetadata | AttentionPlan, q_norm: nn.Module | None = None,
                     k_norm: nn.Module | None = None) -> torch.Tensor:
        """x: [T, hidden] -> [T, Hq * D], the heads before the output projection; writes this step's K/V into
        kv_cache. input_norm: the layer's pre-norm, applied to x by the q/k/v product (None: x is the input).
        q_norm/k_norm: per-head norms applied before RoPE (None: none)."""
        num_tokens, num_q, num_kv = x.shape[0], self.num_heads, self.num_kv_heads
        weight, bias = self.qkv.weights()
        qkv = self.linear_ops.norm_linear(x, input_norm, weight, bias)  # [T, (Hq + 2 Hkv) * D]: q, k, v
        split = (num_q + num_kv) * self.head_dim
        qk = qkv[:, :split].view(num_tokens, num_q + num_kv, self.head_dim)  # q and k heads, adjacent
        v = qkv[:, split:].view(num_tokens, num_kv, self.head_dim)
        if self.attention_kernel.uniform is not None:
            # q/k norms and RoPE inside the uniform-batch kernel (eagerly on any batch it does not take)
            prologue = HeadPrologue(rope, self.ops.apply_rope, q_norm, k_norm)
            return attend(qk[:, :num_q], qk[:, num_q:], v, positions, kv_cache, meta, self.scale,
                          self.attention_kernel, prologue)
        if q_norm is not None:
            qk = torch.cat((q_norm(qk[:, :num_q]), k_norm(qk[:, num_q:])), dim=1)
        qk = self.ops.apply_rope(qk, *rope)  # queries and keys rotated in one pass
        return attend(qk[:, :num_q], qk[:, num_q:], v, positions, kv_cache, meta, self.scale, self.attention_kernel)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with transformers' Llama names (gate_proj, up_proj, down_proj)."""

    ops: PointwiseOps = EAGER
    linear_ops: LinearOps = CUBLAS

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.gate_up = StackedLinear([self.gate_proj, self.up_proj])  # one GEMM; gate/up params kept

    def forward(self, x: torch.Tensor, residual: torch.Tensor, input_norm: RMSNorm | None = None) -> torch.Tensor:
        """residual + mlp(input_norm(x)) (mlp(x) when input_norm is None), accumulated into residual in place;
        x, residual [T, hidden] (the same tensor in a pre-norm layer: x is read before residual is written)."""
        return gated_mlp_(self.linear_ops, self.ops, x, residual, input_norm, self.gate_up, self.down_proj)


def gated_mlp_(linear_ops: LinearOps, ops: PointwiseOps, x: torch.Tensor, residual: torch.Tensor,
               input_norm: RMSNorm | None, gate_up: StackedLinear, down: nn.Linear) -> torch.Tensor:
    """residual += down(silu(gate(n)) * up(n)) with n = input_norm(x) (x when None), in place, on `linear_ops`'
    kernels (which may fuse the norm into the gate/up product, and the SiLU product into the gate/up or the down
    projection) and `ops.silu_mul`. x, residual [T, hidden]; gate_up stacks the gate and up projections (of equal
    widths)."""
    weight, bias = gate_up.weights()
    product = linear_ops.gate_up_silu(x, input_norm, weight, bias)  # [T, I], where the table fuses it
    if product is not None:
        return linear_ops.add_linear_(residual, product, down.weight, down.bias)
    return linear_ops.silu_down_(residual, linear_ops.norm_linear(x, input_norm, weight, bias), ops.silu_mul,
                                 down.weight, down.bias)
