"""The two-kernel Triton argmax over a vocabulary (`specexp.models.triton_argmax`) against torch.argmax: first
maximum on ties, first NaN, -inf rows, strided rows and outputs; on a GPU (`pytest -m cuda`), under Triton's CPU
interpreter, and compiled for a Hopper GPU without one."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    hopper_shared_bytes,
    on_triton_gpu,
    run_in_triton_interpreter,
    tiny_hybrid_pair,
)

from specexp.models import triton_argmax


def _cases(gen: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """(label, fp32 logits): vocabularies below, at and past one chunk, ties, NaNs, infinities."""
    block = triton_argmax.BLOCK
    out = []
    for v in (1, 7, block - 1, block, block + 1, 3 * block + 5, 128256):
        out.append((f"random V={v}", torch.randn(5, v, generator=gen)))
    tied = torch.randn(6, 3 * block + 5, generator=gen)
    top = tied.max() + 1
    tied[0, [5, block + 5]] = top  # the same maximum in two chunks: the first
    tied[1, [block + 7, block + 3]] = top  # twice in one chunk: the first
    tied[2, [3 * block + 4, 2]] = top  # first and last chunk
    tied[3] = top  # every value the maximum: 0
    tied[4, [block * 2, block * 2 + 1]] = float("inf")
    tied[5, -1] = top  # only in the last, partial chunk
    out.append(("ties", tied))
    nans = torch.randn(5, 2 * block + 3, generator=gen)
    nans[0, block + 9] = float("nan")  # a NaN beats every value
    nans[1, [block + 9, 3]] = float("nan")  # the first NaN
    nans[2, 4] = float("inf")
    nans[2, 2 * block + 1] = float("nan")  # NaN beats inf
    nans[3] = float("nan")
    nans[4] = float("-inf")  # all -inf: 0
    out.append(("nan and inf", nans))
    out.append(("all -inf, one chunk", torch.full((2, 9), float("-inf"))))
    return out


def check_argmax(device: str) -> None:
    """triton_argmax.argmax == torch.argmax(dim=-1) on every case, in fp32 / bf16 / fp16, for 2-D, 3-D and 1-D
    inputs, rows with a stride past their length, and a strided 1-D `out` (a column of a token buffer)."""
    gen = torch.Generator().manual_seed(0)
    for label, logits in _cases(gen):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = logits.to(dtype).to(device)
            expected = torch.argmax(x.cpu().float(), dim=-1)
            got = triton_argmax.argmax(x)
            assert got.dtype == torch.int64 and torch.equal(got.cpu(), expected), f"{label} {dtype}: {got} {expected}"
            if x.shape[0] % 2 == 0:  # [R/2, 2, V]: a verify's [rows, k + 1, V]
                three = triton_argmax.argmax(x.view(x.shape[0] // 2, 2, -1))
                assert torch.equal(three.cpu(), expected.view(-1, 2)), label
            assert torch.equal(triton_argmax.argmax(x[0]).cpu(), expected[0]), label  # one row: a 0-dim result
        wide = torch.cat((logits, torch.randn(logits.shape[0], 3, generator=gen)), dim=1).to(device)
        strided = wide[:, : logits.shape[1]]  # rows evenly strided past their length
        tokens = torch.full((logits.shape[0], 4), -1, dtype=torch.int64, device=device)
        triton_argmax.argmax(strided, out=tokens[:, 2])
        assert torch.equal(tokens[:, 2].cpu(), torch.argmax(logits, dim=-1)), f"{label}: strided"
        assert (tokens[:, [0, 1, 3]] == -1).all(), f"{label}: wrote outside its column"


def test_argmax_matches_torch_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_argmax", "check_argmax")


@on_triton_gpu
def test_argmax_matches_torch_on_gpu():
    check_argmax("cuda")


@on_triton_gpu
def test_argmax_is_capturable():
    """Replayed in a CUDA graph, it reads the logits in place and writes the argmax of each replay's values."""
    logits = torch.randn(3, 128256, device="cuda")
    out = torch.empty(3, dtype=torch.int64, device="cuda")
    triton_argmax.argmax(logits, out=out)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_argmax.argmax(logits, out=out)
    for seed in range(3):
        logits.copy_(torch.randn(3, 128256, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        assert torch.equal(out, logits.argmax(-1))


def test_argmax_rejects_what_it_does_not_take():
    if not triton_argmax.AVAILABLE:
        pytest.skip("triton is not installed")
    for bad in (torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 0), torch.zeros(3, 2).t(),
                torch.zeros(2, 3, dtype=torch.int64)):
        assert not triton_argmax.supports(bad)
        with pytest.raises(ValueError, match="triton_argmax.argmax takes"):
            triton_argmax.argmax(bad)
    with pytest.raises(ValueError, match="out must be int64 of shape"):
        triton_argmax.argmax(torch.zeros(2, 3), out=torch.zeros(3, dtype=torch.int64))


def test_both_kernels_compile_for_a_hopper_block():
    """Compiled for sm_90 without a GPU, both kernels build and fit a Hopper block's shared memory."""
    if not triton_argmax.AVAILABLE:
        pytest.skip("triton is not installed")
    chunk = hopper_shared_bytes(
        triton_argmax._chunk_argmax_kernel,
        {"x_ptr": "*fp32", "max_ptr": "*fp32", "index_ptr": "*i32", "nan_ptr": "*i32", "V": "i32", "stride_x": "i32",
         "num_chunks": "i32"}, {"BLOCK": triton_argmax.BLOCK}, triton_argmax.NUM_WARPS)
    row = hopper_shared_bytes(
        triton_argmax._row_argmax_kernel,
        {"max_ptr": "*fp32", "index_ptr": "*i32", "nan_ptr": "*i32", "out_ptr": "*i64", "V": "i32",
         "num_chunks": "i32", "stride_out": "i32"}, {"CHUNKS": triton_argmax.MAX_CHUNKS}, 1)
    assert max(chunk, row) <= HOPPER_SHARED_BYTES


def check_engine_runs_on_it(device: str) -> None:
    """A speculative engine whose rejection sampler and speculator take the Triton argmax emits what the torch
    argmax engine emits: greedy (the draft buffer's columns written in place) and sampled at T = 1 (the
    exponential race), with a hybrid draft and a changing batch."""
    from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
    from specexp.engine.runner import NativeEngine

    target, draft, prompts = tiny_hybrid_pair(device, (5, 9, 3))
    for temperature in (0.0, 1.0):
        outputs = []
        for use_triton in (False, True):
            engine = NativeEngine(target, draft, EngineConfig(device=device, max_num_seqs=2, max_model_len=64),
                                  SpeculatorConfig(num_speculative_tokens=3),
                                  SamplingConfig(temperature=temperature, max_new_tokens=12, ignore_eos=True))
            if use_triton:
                engine.rejection.argmax = engine.speculator.argmax = triton_argmax.argmax
            outputs.append([r.token_ids for r in engine.generate(prompts).requests])
        assert outputs[0] == outputs[1], f"T={temperature}: {outputs}"


def test_engine_runs_on_it_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_argmax", "check_engine_runs_on_it")

