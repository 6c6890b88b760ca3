"""Folding each pre-norm's weight into the projections that read it (`engine.fold_norm_weights`): the same model
up to rounding, on every architecture case (Llama, Qwen2/3, LFM2 with and without attention, biases, tied heads);
idempotent; the final and per-head norms untouched."""

from __future__ import annotations

import pytest
import torch
from harness import PagedRunner
from torch import nn

from specexp.models import load_model
from specexp.models.layers import RMSNorm
from specexp.models.norm_folding import fold_norm_weights, pre_norm_pairs

PROMPTS = {"a": [5, 9, 2, 31, 7, 7, 12], "b": [3, 4]}


def _logits(model) -> dict:
    runner = PagedRunner(model)
    out = runner.step(list(PROMPTS.items()))
    out.update(runner.step([("a", [11]), ("b", [17, 2, 8])]))  # a decode and a second chunk, cached keys
    return out


def test_folded_model_computes_the_same_logits(case):
    plain, folded = load_model(case.path), load_model(case.path)
    norms = [norm for norm, _ in pre_norm_pairs(folded)]
    assert norms and not any(torch.equal(n.weight, torch.ones_like(n.weight)) for n in norms), "random norms"
    before = _logits(plain)
    assert fold_norm_weights(folded) == len(norms) == 2 * folded.config.num_hidden_layers
    assert all(n.folded and torch.equal(n.weight, torch.ones_like(n.weight)) for n in norms)
    after = _logits(folded)
    for rid in before:
        torch.testing.assert_close(after[rid], before[rid], atol=1e-4, rtol=1e-4)
    # Only the decoder layers' pre-norms fold: the final norm (before a possibly tied head) and per-head q/k
    # norms keep their weights.
    others = [m for m in folded.modules() if isinstance(m, RMSNorm) and all(m is not n for n in norms)]
    assert others and not any(m.folded for m in others)


def test_folding_twice_changes_nothing(case):
    model = load_model(case.path)
    fold_norm_weights(model)
    state = {name: p.clone() for name, p in model.state_dict().items()}
    assert fold_norm_weights(model) == 0
    assert all(torch.equal(p, state[name]) for name, p in model.state_dict().items())


def test_stacked_projections_see_the_folded_weights(case_cache):
    """q/k/v and gate/up run as one stacked GEMM over the parameters' shared storage: folding in place must
    reach it."""
    model = load_model(case_cache("llama-mha-untied").path)
    layer = model.model.layers[0]
    g = layer.input_layernorm.weight.detach().clone()
    q_before = layer.self_attn.q_proj.weight.detach().clone()
    fold_norm_weights(model)
    weight, _ = layer.self_attn.qkv.weights()
    torch.testing.assert_close(weight[: q_before.shape[0]], q_before * g)
    assert weight.data_ptr() == layer.self_attn.q_proj.weight.data_ptr()


def test_models_without_pre_norm_projections_are_refused():
    with pytest.raises(ValueError, match="declares no pre-norm projections"):
        fold_norm_weights(nn.Sequential(nn.Linear(4, 4)))
