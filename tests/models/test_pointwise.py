"""Compiled pointwise ops (torch.compile, inductor) against the eager ones they fuse."""

from __future__ import annotations

import pytest
import torch

from specexp.models import load_model
from specexp.models.pointwise import EAGER, PointwiseOps, compiled_pointwise_ops, use_pointwise_ops


@pytest.fixture(scope="module")
def compiled():
    return compiled_pointwise_ops()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 7])
def test_compiled_ops_give_the_eager_values(compiled, dtype, num_tokens):
    gen = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, 96, generator=gen).to(dtype)
    weight = torch.randn(96, generator=gen).to(dtype)
    heads = torch.randn(num_tokens, 6, 32, generator=gen).to(dtype)
    cos, sin = (torch.randn(num_tokens, 32, generator=gen).to(dtype) for _ in range(2))
    # the SiLU product and RoPE keep eager's roundings exactly (emulated precision casts)
    assert torch.equal(compiled.silu_mul(x, 2 * x), EAGER.silu_mul(x, 2 * x))
    assert torch.equal(compiled.apply_rope(heads, cos, sin), EAGER.apply_rope(heads, cos, sin))
    ext = torch.randn(num_tokens, 96, 2 + 4, generator=gen).to(dtype)  # [R, D, W-1+q], W = 3, q = 4
    conv_weight = torch.randn(96, 3, generator=gen).to(dtype)
    assert torch.equal(compiled.conv_taps(ext, conv_weight, 4), EAGER.conv_taps(ext, conv_weight, 4))
    # RMSNorm: the same up to the last bit of the fp32 reduction order
    torch.testing.assert_close(compiled.rms_norm(x, weight, 1e-5), EAGER.rms_norm(x, weight, 1e-5),
                               rtol=1e-6 if dtype == torch.float32 else 0, atol=1e-6 if dtype == torch.float32 else 0)


def test_a_model_switches_every_pointwise_module(compiled):
    model = load_model("configs/tiny-random-lfm2", weights="random")
    tables = [m.ops for m in model.modules() if isinstance(getattr(m, "ops", None), PointwiseOps)]
    assert tables and all(t is EAGER for t in tables)
    use_pointwise_ops(model, compiled)
    assert all(m.ops is compiled for m in model.modules() if isinstance(getattr(m, "ops", None), PointwiseOps))
