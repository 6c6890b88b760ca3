"""Native models (Llama family, LFM2) over a flattened varlen batch with paged KV and conv-state caches.

    model = load_model("path/or/zoo-name/or/org/name", dtype=torch.bfloat16, device="cuda")
    hidden = model(input_ids, positions, ForwardContext(attn_meta, conv_meta, kv_caches, conv_states))
    logits = model.compute_logits(hidden[logits_indices])  # the final norm, then the LM head

Imports only torch, safetensors and tokenizers.
"""

from specexp.models.caches import allocate_conv_states, allocate_kv_caches
from specexp.models.causal_lm import CausalLM
from specexp.models.config import ModelConfig, UnsupportedModelError
from specexp.models.loader import load_config, load_model, load_tokenizer, resolve_model_dir
from specexp.models.metadata import NULL_BLOCK_ID, AttentionMetadata, ForwardContext, ShortConvMetadata

__all__ = [
    "NULL_BLOCK_ID",
    "AttentionMetadata",
    "CausalLM",
    "ForwardContext",
    "ModelConfig",
    "ShortConvMetadata",
    "UnsupportedModelError",
    "allocate_conv_states",
    "allocate_kv_caches",
    "load_config",
    "load_model",
    "load_tokenizer",
    "resolve_model_dir",
]
