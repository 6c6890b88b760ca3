"""Native Llama family (Llama 2/3, Qwen2 with q/k/v biases, Qwen3 with per-head q/k RMSNorm).

Pre-norm decoder: h += attn(input_layernorm(h)); h += mlp(post_attention_layernorm(h)); final `norm` (applied with
the LM head, `CausalLM.compute_logits`).
Module names match transformers' LlamaForCausalLM / Qwen2 / Qwen3 checkpoints key for key.
"""

from __future__ import annotations

import torch
from torch import nn

from specexp.models.causal_lm import CausalLM
from specexp.models.config import ModelConfig
from specexp.models.layers import (
    GatedMLP,
    QKVAttention,
    RMSNorm,
    RotaryEmbedding,
    TokenEmbedding,
    add_projection_,
)
from specexp.models.metadata import AttentionMetadata
from specexp.models.segments import forward_plans


class LlamaAttention(QKVAttention):
    """q/k/v projections (+ optional per-head q/k norm), rope, paged attention, o_proj."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, qkv_bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_dim, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: torch.Tensor,
        input_norm: RMSNorm | None,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        residual: torch.Tensor,
    ) -> torch.Tensor:
        """residual + attention(input_norm(x)), accumulated into residual in place; x, residual [T, hidden] (the
        same tensor in the decoder layer). Writes this step's K/V into kv_cache."""
        heads = self.attend_heads(x, input_norm, positions, rope, kv_cache, meta, self.q_norm, self.k_norm)
        return add_projection_(self.linear_ops, residual, heads, self.o_proj)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def pre_norm_projections(self) -> list[tuple[RMSNorm, list[nn.Linear]]]:
        """Each pre-norm with the projections that read its output (:mod:`specexp.models.norm_folding`)."""
        attn, mlp = self.self_attn, self.mlp
        return [(self.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj]),
                (self.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])]

    def forward(self, h, positions, rope, kv_cache, meta):
        """h [T, hidden], the residual stream, updated in place and returned (each norm is applied by the
        projection that reads it, so the linear kernels may fuse the two)."""
        h = self.self_attn(h, self.input_layernorm, positions, rope, kv_cache, meta, residual=h)
        return self.mlp(h, residual=h, input_norm=self.post_attention_layernorm)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = TokenEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rope, config.head_dim)

    def forward(self, input_ids, positions, ctx):
        h = self.embed_tokens(input_ids)
        rope = self.rotary_emb(positions, h.dtype)
        plan, _ = forward_plans(ctx, positions)  # index tensors shared by every layer of this forward
        for layer, kv_cache in zip(self.layers, ctx.kv_caches, strict=True):
            h = layer(h, positions, rope, kv_cache, plan)
        return h  # before the final norm: the LM head applies it (CausalLM.compute_logits)

    @property
    def final_norm(self) -> RMSNorm:
        return self.norm


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.model = LlamaModel(config)
        self._finish_init()
