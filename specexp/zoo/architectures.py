"""Hugging Face configs and models for the demo architectures (``llama`` and ``lfm2``).

A zoo config names ``arch`` and a few size fields; everything else (vocabulary, special ids, RoPE,
tied embeddings) is fixed here so that every demo model shares the tokenizer and the conventions.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Lfm2Config, Lfm2ForCausalLM, LlamaConfig, LlamaForCausalLM, PretrainedConfig

from specexp.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

ARCHS = ("llama", "lfm2")
_SHARED = {
    "vocab_size": VOCAB_SIZE,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def build_config(arch: str, size: dict[str, Any]) -> PretrainedConfig:
    """HF config for ``arch`` with the size fields in ``size``.

    llama: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
    max_position_embeddings. lfm2: the same plus ``layer_types`` (``"conv"`` | ``"full_attention"`` per
    layer) and ``conv_L_cache``; the FFN width is taken as given (``block_auto_adjust_ff_dim: false``), and
    ``conv_dim``/``block_dim`` are recorded because vLLM's LFM2 reads them.
    """
    size = dict(size)
    if arch == "llama":
        return LlamaConfig(**_SHARED, rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False, **size)
    if arch == "lfm2":
        layer_types = list(size.pop("layer_types"))
        config = Lfm2Config(
            **_SHARED,
            norm_eps=1e-5,
            conv_bias=False,
            conv_L_cache=size.pop("conv_L_cache", 3),
            block_auto_adjust_ff_dim=False,
            layer_types=layer_types,
            full_attn_idxs=[i for i, t in enumerate(layer_types) if t == "full_attention"],
            **size,
        )
        config.conv_dim = config.hidden_size
        config.block_dim = config.hidden_size
        return config
    raise ValueError(f"unknown zoo architecture {arch!r}: expected one of {ARCHS}")


def build_model(arch: str, size: dict[str, Any], seed: int) -> torch.nn.Module:
    """A freshly initialised fp32 causal LM of the given architecture and size."""
    config = build_config(arch, size)
    torch.manual_seed(seed)
    model_class = LlamaForCausalLM if arch == "llama" else Lfm2ForCausalLM
    return model_class(config)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embedding/LM-head weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
