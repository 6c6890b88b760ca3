"""Stacked projections: one GEMM for q/k/v (gate/up) with the checkpoint's parameters kept where they were, and
a stacked weight that can never go stale, whatever re-allocates the parameters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specexp.models import load_model
from specexp.models.stacked import StackedLinear


def _linears(bias: bool, seed: int = 0) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(16, 24, bias=bias), nn.Linear(16, 8, bias=bias), nn.Linear(16, 8, bias=bias)]


def _separate(linears, x):
    return [torch.nn.functional.linear(x, lin.weight, lin.bias) for lin in linears]


@pytest.mark.parametrize("bias", [False, True])
def test_one_gemm_equals_the_separate_projections_and_shares_their_storage(bias):
    linears = _linears(bias)
    params_before = [lin.weight for lin in linears]
    stacked = StackedLinear(linears)
    x = torch.randn(5, 16)
    expected = _separate(linears, x)
    for got, want in zip(stacked(x), expected, strict=True):
        torch.testing.assert_close(got, want)
    # the Parameter objects are the same; only their storage moved into the stacked weight
    assert [lin.weight for lin in linears] == params_before
    with torch.no_grad():
        linears[1].weight.mul_(2.0)  # an in-place update of one projection (as a checkpoint load does)
    weight, _ = stacked.weights()
    torch.testing.assert_close(weight[24:32], linears[1].weight)
    torch.testing.assert_close(stacked(x)[1], _separate(linears, x)[1])


def test_reallocated_parameters_are_restacked_before_use():
    linears = _linears(bias=True)
    stacked = StackedLinear(linears)
    x = torch.randn(3, 16, dtype=torch.float64)
    stacked(x.float())
    module = nn.ModuleList(linears).to(torch.float64)  # .to() re-allocates every parameter separately
    got = stacked(x)
    assert got[0].dtype == torch.float64
    for g, want in zip(got, _separate(module, x), strict=True):
        torch.testing.assert_close(g, want)
    replacement = _linears(bias=True, seed=1)
    module.load_state_dict(nn.ModuleList(replacement).state_dict(), assign=True)  # new parameter tensors
    for g, want in zip(stacked(x.float()), _separate(replacement, x.float()), strict=True):
        torch.testing.assert_close(g, want)


def test_mismatched_projections_are_refused():
    with pytest.raises(ValueError, match="share their input width"):
        StackedLinear([nn.Linear(16, 8), nn.Linear(12, 8)])
    with pytest.raises(ValueError, match="biases or none"):
        StackedLinear([nn.Linear(16, 8, bias=True), nn.Linear(16, 8, bias=False)])


@pytest.mark.parametrize("name", ["tiny-llama", "configs/tiny-random-lfm2"])
def test_models_keep_their_checkpoint_parameters(name):
    """Stacking changes no parameter name, count or value: q/k/v and gate/up stay separate parameters."""
    weights = "trained" if name == "tiny-llama" else "random"
    model = load_model(name, weights=weights)
    names = [n for n, _ in model.named_parameters()]
    assert any(n.endswith("q_proj.weight") for n in names)
    assert any(n.endswith(("gate_proj.weight", "w1.weight")) for n in names)
    total = sum(p.numel() for p in model.parameters())
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert total == model.num_parameters()
    assert len(storages) < len(names)  # q/k/v (and gate/up) of a layer share one storage
