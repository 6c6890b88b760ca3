"""Native LFM2 (LiquidAI): a hybrid of gated short-conv layers and GQA attention layers with q/k norm.

Each layer: h += op(operator_norm(h)); h += feed_forward(ffn_norm(h)), where op is attention or the short
conv; the final norm is called `embedding_norm` in the checkpoints (it is applied last, not to the
embeddings). Short conv (transformers' Lfm2ShortConv):

    B, C, x = chunk(in_proj(h), 3)          # each [T, hidden]
    y = C * causal_depthwise_conv(B * x)     # kernel conv_L_cache over each request's token stream
    out = out_proj(y)

The conv runs through `short_conv_ops.gated_short_conv` with the step's ShortConvMetadata and the layer's
conv-state cache, so a request's stream continues across steps (chunked prefill, decode, verification).
Module names match transformers' Lfm2ForCausalLM checkpoints key for key.
"""

from __future__ import annotations

import torch
from torch import nn

from specexp.models.attention import AttentionPlan
from specexp.models.causal_lm import CausalLM
from specexp.models.config import ModelConfig
from specexp.models.kernels import UniformKernel
from specexp.models.layers import (
    QKVAttention,
    RMSNorm,
    RotaryEmbedding,
    TokenEmbedding,
    add_projection_,
    gated_mlp_,
)
from specexp.models.linear_ops import CUBLAS, LinearOps
from specexp.models.metadata import AttentionMetadata, ShortConvMetadata
from specexp.models.pointwise import EAGER, PointwiseOps
from specexp.models.segments import forward_plans
from specexp.models.short_conv_ops import TORCH_CONV, ConvPlan, gated_short_conv
from specexp.models.stacked import StackedLinear


class Lfm2Attention(QKVAttention):
    """q/k/v projections, per-head q/k RMSNorm, rope, paged attention, out_proj (no biases)."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, qkv_bias=False)
        self.out_proj = nn.Linear(self.q_dim, config.hidden_size, bias=False)
        self.q_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, input_norm: RMSNorm | None, positions, rope, kv_cache: torch.Tensor,
                meta: AttentionMetadata, residual: torch.Tensor) -> torch.Tensor:
        """residual + attention(input_norm(x)), accumulated into residual in place; x, residual [T, hidden] (the
        same tensor in the decoder layer). Writes this step's K/V into kv_cache."""
        heads = self.attend_heads(x, input_norm, positions, rope, kv_cache, meta, self.q_layernorm,
                                  self.k_layernorm)
        return add_projection_(self.linear_ops, residual, heads, self.out_proj)


class DepthwiseConvWeights(nn.Module):
    """Holds the depthwise kernel under transformers' `conv.weight` [hidden, 1, L_cache] (and `conv.bias`)."""

    def __init__(self, dim: int, kernel_size: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None


class Lfm2ShortConv(nn.Module):
    """in_proj -> (B, C, x); C * conv(B * x) over each request's stream and conv state; out_proj."""

    ops: PointwiseOps = EAGER
    linear_ops: LinearOps = CUBLAS
    conv_kernel: UniformKernel = TORCH_CONV

    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden = config.hidden_size
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=config.conv_bias)
        self.conv = DepthwiseConvWeights(hidden, config.conv_L_cache, config.conv_bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=config.conv_bias)

    def forward(self, h: torch.Tensor, input_norm: RMSNorm | None, conv_state: torch.Tensor,
                meta: ShortConvMetadata | ConvPlan, residual: torch.Tensor) -> torch.Tensor:
        """residual + short_conv(input_norm(h)), accumulated into residual in place; h, residual [T, hidden] (the
        same tensor in the decoder layer); conv_state [num_slots, hidden, state_len] updated in place."""
        bcx = self.linear_ops.norm_linear(h, input_norm, self.in_proj.weight, self.in_proj.bias)  # [T, 3 * hidden]
        weight = self.conv.weight.view(self.conv.weight.shape[0], -1)  # [hidden, L_cache]
        gated = gated_short_conv(bcx, weight, self.conv.bias, conv_state, meta, self.ops.conv_taps, self.conv_kernel)
        return add_projection_(self.linear_ops, residual, gated, self.out_proj)


class Lfm2FeedForward(nn.Module):
    """w2(silu(w1(x)) * w3(x)) (transformers' Lfm2MLP names; width already auto-adjusted in the config)."""

    ops: PointwiseOps = EAGER
    linear_ops: LinearOps = CUBLAS

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.w1_w3 = StackedLinear([self.w1, self.w3])  # one GEMM; w1/w3 params kept

    def forward(self, x: torch.Tensor, residual: torch.Tensor, input_norm: RMSNorm | None = None) -> torch.Tensor:
        """residual + feed_forward(input_norm(x)), accumulated into residual in place; x, residual [T, hidden]."""
        return gated_mlp_(self.linear_ops, self.ops, x, residual, input_norm, self.w1_w3, self.w2)


class Lfm2DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_type: str):
        super().__init__()
        self.is_attention = layer_type == "attention"
        if self.is_attention:
            self.self_attn = Lfm2Attention(config)
        else:
            self.conv = Lfm2ShortConv(config)
        self.feed_forward = Lfm2FeedForward(config)
        self.operator_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def pre_norm_projections(self) -> list[tuple[RMSNorm, list[nn.Linear]]]:
        """Each pre-norm with the projections that read its output (:mod:`specexp.models.norm_folding`)."""
        if self.is_attention:
            operator = [self.self_attn.q_proj, self.self_attn.k_proj, self.self_attn.v_proj]
        else:
            operator = [self.conv.in_proj]
        return [(self.operator_norm, operator), (self.ffn_norm, [self.feed_forward.w1, self.feed_forward.w3])]

    def forward(self, h, positions, rope, cache: torch.Tensor, plan: AttentionPlan | None,
                conv_plan: ConvPlan | None) -> torch.Tensor:
        """h [T, hidden], the residual stream, updated in place and returned. cache: this layer's KV cache
        (attention) or conv-state cache (conv); plan / conv_plan: the forward's shared attention / conv
        indices."""
        if self.is_attention:  # each norm is applied by the projection that reads it (a fusable pair)
            h = self.self_attn(h, self.operator_norm, positions, rope, cache, plan, residual=h)
        else:
            h = self.conv(h, self.operator_norm, cache, conv_plan, residual=h)
        return self.feed_forward(h, residual=h, input_norm=self.ffn_norm)


class Lfm2Model(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = TokenEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Lfm2DecoderLayer(config, t) for t in config.layer_types)
        self.embedding_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rope, config.head_dim)
        self.num_attention_layers = config.num_attention_layers
        self.num_conv_layers = config.num_conv_layers

    def forward(self, input_ids, positions, ctx):
        if len(ctx.kv_caches) != self.num_attention_layers or len(ctx.conv_states) != self.num_conv_layers:
            raise ValueError(
                f"LFM2 needs {self.num_attention_layers} KV caches and {self.num_conv_layers} conv states, "
                f"got {len(ctx.kv_caches)} and {len(ctx.conv_states)}"
            )
        h = self.embed_tokens(input_ids)
        rope = self.rotary_emb(positions, h.dtype) if ctx.kv_caches else None
        plan, conv_plan = forward_plans(ctx, positions)  # shared by every attention / conv layer
        kv_caches, conv_states = iter(ctx.kv_caches), iter(ctx.conv_states)
        for layer in self.layers:
            cache = next(kv_caches if layer.is_attention else conv_states)
            h = layer(h, positions, rope, cache, plan, conv_plan)
        return h  # before the final norm: the LM head applies it (CausalLM.compute_logits)

    @property
    def final_norm(self) -> RMSNorm:
        return self.embedding_norm


class Lfm2ForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.model = Lfm2Model(config)
        self._finish_init()
