"""Allocation of a model's per-layer caches (zero-initialised, engine-owned).

`allocate_kv_caches(...)[i]` belongs to the i-th attention layer (`model.attention_layer_ids[i]`),
`allocate_conv_states(...)[j]` to the j-th conv layer (`model.conv_layer_ids[j]`); both lists go straight
into `ForwardContext.kv_caches` / `.conv_states`. KV block 0 and conv-state slot 0 are the NULL
block/slot: allocate one more than the requests need.
"""

from __future__ import annotations

import torch

from specexp.models.causal_lm import CausalLM


def allocate_kv_caches(
    model: CausalLM, num_blocks: int, block_size: int, device: torch.device | str, dtype: torch.dtype
) -> list[torch.Tensor]:
    """One zeroed [2, num_blocks, block_size, Hkv, D] tensor per attention layer."""
    shape = model.kv_cache_shape(num_blocks, block_size)
    return [torch.zeros(shape, device=device, dtype=dtype) for _ in model.attention_layer_ids]


def allocate_conv_state_stack(
    model: CausalLM, num_slots: int, num_spec_tokens: int, device: torch.device | str, dtype: torch.dtype
) -> torch.Tensor | None:
    """Every conv layer's state in one zeroed tensor [num_conv_layers, num_slots, hidden, (L_cache - 1) +
    num_spec_tokens] (None without conv layers): an op over all layers' states (the draft's scratch-window
    seeding) is then one op, not one per layer."""
    if not model.conv_layer_ids:
        return None
    shape = model.conv_state_shape(num_slots, num_spec_tokens)
    return torch.zeros(len(model.conv_layer_ids), *shape, device=device, dtype=dtype)


def allocate_conv_states(
    model: CausalLM, num_slots: int, num_spec_tokens: int, device: torch.device | str, dtype: torch.dtype
) -> list[torch.Tensor]:
    """One zeroed [num_slots, hidden, (L_cache - 1) + num_spec_tokens] tensor per conv layer: the layers of
    :func:`allocate_conv_state_stack` (contiguous views of it)."""
    stack = allocate_conv_state_stack(model, num_slots, num_spec_tokens, device, dtype)
    return [] if stack is None else list(stack.unbind(0))


def cache_bytes(caches: list[torch.Tensor]) -> int:
    """Total bytes held by a list of cache tensors."""
    return sum(t.numel() * t.element_size() for t in caches)
