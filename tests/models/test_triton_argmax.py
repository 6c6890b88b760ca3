"""The Triton argmax over a vocabulary, in two launches and in one (`specexp.models.triton_argmax`), against
torch.argmax: first maximum on ties, first NaN, -inf rows, strided rows and outputs; on a GPU (`pytest -m cuda`),
under Triton's CPU interpreter, and compiled for a Hopper GPU without one."""

from __future__ import annotations

import functools

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
    inputs, rows with a stride past their length, and a strided 1-D `out` (a column of a token buffer); in two
    launches and in one (tickets, shared by every call, which each call leaves at 0), and in two where the tickets
    are too few for the rows."""
    gen = torch.Generator().manual_seed(0)
    tickets = triton_argmax.new_tickets(8, device)
    for label, logits in _cases(gen):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = logits.to(dtype).to(device)
            expected = torch.argmax(x.cpu().float(), dim=-1)
            for given in (None, tickets, tickets[:2]):
                got = triton_argmax.argmax(x, tickets=given)
                assert got.dtype == torch.int64 and torch.equal(got.cpu(), expected), f"{label} {dtype}: {got}"
                assert not tickets.any(), f"{label}: tickets left at {tickets}"
            if x.shape[0] % 2 == 0:  # [R/2, 2, V]: a verify's [rows, k + 1, V]
                three = triton_argmax.argmax(x.view(x.shape[0] // 2, 2, -1), tickets=tickets)
                assert torch.equal(three.cpu(), expected.view(-1, 2)), label
            for given in (None, tickets):  # one row: a 0-dim result
                assert torch.equal(triton_argmax.argmax(x[0], tickets=given).cpu(), expected[0]), label
        wide = torch.cat((logits, torch.randn(logits.shape[0], 3, generator=gen)), dim=1).to(device)
        strided = wide[:, : logits.shape[1]]  # rows evenly strided past their length
        for given in (None, tickets):
            tokens = torch.full((logits.shape[0], 4), -1, dtype=torch.int64, device=device)
            triton_argmax.argmax(strided, out=tokens[:, 2], tickets=given)
            assert torch.equal(tokens[:, 2].cpu(), torch.argmax(logits, dim=-1)), f"{label}: strided"
            assert (tokens[:, [0, 1, 3]] == -1).all(), f"{label}: wrote outside its column"
    assert not tickets.any()


def test_argmax_matches_torch_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_argmax", "check_argmax")


@on_triton_gpu
def test_argmax_matches_torch_on_gpu():
    check_argmax("cuda")


@on_triton_gpu
@pytest.mark.parametrize("one_launch", [False, True])
def test_argmax_is_capturable(one_launch):
    """Replayed in a CUDA graph, it reads the logits in place and writes the argmax of each replay's values; in
    one launch, two captured calls share the tickets and leave them at 0 on every replay."""
    logits = torch.randn(3, 128256, device="cuda")
    small = torch.randn(2, 1000, device="cuda")
    out = torch.empty(3, dtype=torch.int64, device="cuda")
    small_out = torch.empty(2, dtype=torch.int64, device="cuda")
    tickets = triton_argmax.new_tickets(4, "cuda") if one_launch else None
    triton_argmax.argmax(logits, out=out, tickets=tickets)  # compiles outside the capture
    triton_argmax.argmax(small, out=small_out, tickets=tickets)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_argmax.argmax(logits, out=out, tickets=tickets)
        triton_argmax.argmax(small, out=small_out, tickets=tickets)
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        logits.copy_(torch.randn(3, 128256, generator=gen).cuda())
        small.copy_(torch.randn(2, 1000, generator=gen).cuda())
        graph.replay()
        assert torch.equal(out, logits.argmax(-1)) and torch.equal(small_out, small.argmax(-1)), seed
    if one_launch:
        torch.cuda.synchronize()
        assert not tickets.any()


@on_triton_gpu
def test_one_launch_sees_every_chunk():
    """Many rows of many chunks, the maximum of each row in a random chunk, replayed back to back: the program
    that takes a row's last ticket reads every other program's partials (memory ordering across programs)."""
    rows, v = 64, 128256
    tickets = triton_argmax.new_tickets(rows, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    outs = []
    for _ in range(50):
        logits = torch.randn(rows, v, device="cuda", generator=gen)
        top = torch.randint(0, v, (rows,), device="cuda", generator=gen)
        logits[torch.arange(rows, device="cuda"), top] = 10.0
        outs.append((triton_argmax.argmax(logits, tickets=tickets), top))
    for got, top in outs:
        assert torch.equal(got, top)
    assert not tickets.any()


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
    with pytest.raises(ValueError, match="tickets must be new_tickets"):
        triton_argmax.argmax(torch.zeros(2, 3), tickets=torch.zeros(2, dtype=torch.int64))


def test_the_kernels_compile_for_a_hopper_block():
    """Compiled for sm_90 without a GPU, the three kernels build and fit a Hopper block's shared memory."""
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
    one = hopper_shared_bytes(
        triton_argmax._argmax_kernel,
        {"x_ptr": "*fp32", "max_ptr": "*fp32", "index_ptr": "*i32", "nan_ptr": "*i32", "tickets_ptr": "*i32",
         "out_ptr": "*i64", "V": "i32", "stride_x": "i32", "num_chunks": "i32", "stride_out": "i32"},
        {"BLOCK": triton_argmax.BLOCK, "CHUNKS": triton_argmax.MAX_CHUNKS}, triton_argmax.NUM_WARPS)
    assert max(chunk, row, one) <= HOPPER_SHARED_BYTES


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
            if use_triton:  # one launch each, on tickets of their own
                engine.rejection.argmax = functools.partial(triton_argmax.argmax,
                                                            tickets=triton_argmax.new_tickets(64, device))
                engine.speculator.argmax = functools.partial(triton_argmax.argmax,
                                                             tickets=triton_argmax.new_tickets(64, device))
            outputs.append([r.token_ids for r in engine.generate(prompts).requests])
        assert outputs[0] == outputs[1], f"T={temperature}: {outputs}"


def test_engine_runs_on_it_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_argmax", "check_engine_runs_on_it")

