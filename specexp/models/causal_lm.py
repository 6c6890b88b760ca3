"""`CausalLM`: what every native model exposes to the engine, whatever its layers.

A concrete model (`LlamaForCausalLM`, `Lfm2ForCausalLM`) builds `self.model` (embeddings, layers, final
norm) and `self.lm_head` with transformers' module names, so a HF state dict loads key for key. The engine
only uses the methods below: cache shapes per layer kind, `forward` over a flat batch, `compute_logits`.

`forward` returns the residual stream after the last layer; `compute_logits` applies the final norm to the rows
it is given and projects them, so a linear-ops table may fuse the two (one kernel fewer in a batch-1 step), and a
prompt's forward normalises only the rows that get logits.
"""

from __future__ import annotations

import torch
from torch import nn

from specexp.models.config import ModelConfig
from specexp.models.linear_ops import CUBLAS, LinearOps
from specexp.models.metadata import ForwardContext


class CausalLM(nn.Module):
    """Base class. Subclasses set `self.model` and call `_finish_init()` at the end of `__init__`."""

    linear_ops: LinearOps = CUBLAS  # the LM head's kernels (models.linear_ops)

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # Index of each layer among the layers of its kind: ForwardContext.kv_caches[i] / conv_states[i].
        self.attention_layer_ids = [i for i, t in enumerate(config.layer_types) if t == "attention"]
        self.conv_layer_ids = [i for i, t in enumerate(config.layer_types) if t == "conv"]

    def _finish_init(self) -> None:
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        self.tie_weights()
        self.eval()

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head when the config ties them (re-run after `to_empty`)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Shape of one attention layer's paged cache: [2 (key, value), num_blocks, block_size, Hkv, D]."""
        return (2, num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)

    def conv_state_shape(self, num_slots: int, num_spec_tokens: int) -> tuple[int, ...]:
        """Shape of one short-conv layer's state cache: [num_slots, hidden, (L_cache - 1) + num_spec_tokens]."""
        if not self.conv_layer_ids:
            raise ValueError(f"{self.config.name_or_path or 'model'} has no conv layers (no conv state)")
        return (num_slots, self.config.hidden_size, self.config.conv_L_cache - 1 + num_spec_tokens)

    @property
    def final_norm(self) -> nn.Module:
        """The RMSNorm after the last layer (transformers' `model.norm`, LFM2's `model.embedding_norm`), which
        :meth:`compute_logits` applies."""
        return self.model.final_norm

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """input_ids, positions: int64[T] (flat batch) -> hidden [T, hidden_size], the residual stream after the
        last layer (before the final norm, which :meth:`compute_logits` applies)."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden_size] rows of :meth:`forward`'s output -> float32[N, vocab_size]: the LM head's
        logits of the final norm of each row (the table's `norm_float_logits`, which may fuse the two)."""
        return self.linear_ops.norm_float_logits(hidden, self.final_norm, self.lm_head.weight, self.lm_head.bias)

    def num_parameters(self) -> int:
        """Distinct parameter elements (a tied head counted once)."""
        return sum(p.numel() for p in self.parameters())
