"""The eager pointwise ops against their definitions, and the compiled ones (torch.compile, inductor) against
the eager ones they fuse."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.models import load_model
from specexp.models.layers import RotaryEmbedding
from specexp.models.pointwise import (
    EAGER,
    PointwiseOps,
    apply_rope,
    compiled_pointwise_ops,
    rms_norm,
    rms_norm_cpu,
    use_pointwise_ops,
)


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
    # the rotary tables: cos and sin of the same fp32 angles, at positions up to 10^5 (to the last bit of fp32's
    # cos / sin, rounded to dtype)
    positions = torch.randint(0, 100_000, (num_tokens,), generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    for got, want in zip(compiled.rope_tables(positions, inv_freq, dtype), EAGER.rope_tables(positions, inv_freq,
                                                                                            dtype), strict=True):
        assert got.shape == (num_tokens, 32) and got.dtype == dtype
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6 if dtype == torch.float32 else 0)
    # RMSNorm: the same up to the last bit of the fp32 reduction order
    torch.testing.assert_close(compiled.rms_norm(x, weight, 1e-5), EAGER.rms_norm(x, weight, 1e-5),
                               rtol=1e-6 if dtype == torch.float32 else 0, atol=1e-6 if dtype == torch.float32 else 0)


def test_a_model_switches_every_pointwise_module(compiled):
    model = load_model("configs/tiny-random-lfm2", weights="random")
    tables = [m.ops for m in model.modules() if isinstance(getattr(m, "ops", None), PointwiseOps)]
    assert tables and all(t is EAGER for t in tables)
    assert any(isinstance(m, RotaryEmbedding) for m in model.modules() if getattr(m, "ops", None) is EAGER)
    use_pointwise_ops(model, compiled)
    assert all(m.ops is compiled for m in model.modules() if isinstance(getattr(m, "ops", None), PointwiseOps))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), width=st.sampled_from([2, 32, 96, 256, 1000]), scale=st.floats(1e-3, 1e3),
       eps=st.sampled_from([1e-6, 1e-5]), seed=st.integers(0, 2**16))
def test_cpu_rms_norm_as_one_layer_norm_agrees_with_torch_rms_norm(rows, width, scale, eps, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, width, generator=gen) * scale
    weight = torch.randn(width, generator=gen)
    expected = torch.nn.functional.rms_norm(x, (width,), weight, eps)
    torch.testing.assert_close(rms_norm_cpu(x, weight, eps), expected, rtol=2e-6, atol=2e-6 * weight.abs().max())
    assert torch.equal(rms_norm(x, weight, eps), rms_norm_cpu(x, weight, eps))  # the path fp32 CPU tensors take


def test_rope_rotates_half_exactly_as_transformers_writes_it():
    gen = torch.Generator().manual_seed(0)
    heads = torch.randn(5, 4, 64, generator=gen)
    cos, sin = torch.randn(5, 64, generator=gen), torch.randn(5, 64, generator=gen)
    rotate_half = torch.cat((-heads[..., 32:], heads[..., :32]), dim=-1)
    signed_sin = torch.cat((-sin[:, :32], sin[:, 32:]), dim=-1)  # rotate_half's sign moved into sin
    expected = heads * cos.unsqueeze(1) + rotate_half * sin.unsqueeze(1)
    assert torch.equal(apply_rope(heads, cos, signed_sin), expected)


def test_rope_tables_are_made_once_when_first_read():
    """A forward's RopeTables makes its tables on first read only, once for every layer that reads them, and a
    segment's rows are slices of them (made by the parent)."""
    from specexp.models.rope import RopeTables

    calls = []

    def make(positions, inv_freq, dtype):
        calls.append(positions.shape[0])
        return EAGER.rope_tables(positions, inv_freq, dtype)

    positions, inv_freq = torch.arange(6), torch.rand(4)
    rope = RopeTables(positions, inv_freq, torch.float32, make)
    segment = rope.rows(2, 5)
    assert calls == [] and torch.equal(segment.positions, positions[2:5])
    cos, sin = segment
    assert calls == [6]
    full_cos, full_sin = rope
    assert calls == [6] and torch.equal(cos, full_cos[2:5]) and torch.equal(sin, full_sin[2:5])
    assert all(torch.equal(a, b) for a, b in zip(rope.tables, EAGER.rope_tables(positions, inv_freq, torch.float32)))
