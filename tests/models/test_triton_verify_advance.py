"""A steady verify batch's inputs advanced in one Triton kernel (`verify_advance.advance_verify_rows_triton`) against
the torch path (`advance_verify_rows`): the same buffers for random batches (query lengths 1..K + 1, rows that
accepted 0..q tokens, positions crossing KV blocks, draft rows out of order, with and without drafts; tokens and
rows past the batch untouched), under Triton's CPU interpreter, on a GPU, and compiled for a Hopper GPU without
one. Whole engines (which take the kernel on a GPU) are checked against host staging in
tests/engine/test_steady_inputs.py and the GPU twin tests/engine/test_cuda_graphs.py."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    hopper_shared_bytes,
    on_triton_gpu,
    run_in_triton_interpreter,
)

from specexp.engine import verify_advance


def _batch(gen: torch.Generator, num_reqs: int, k: int, block_size: int, max_blocks: int, drafts: bool) -> dict:
    """Buffers of a batch of num_reqs rows (8 rows and 64 tokens of room) as the last step left them."""
    max_rows, max_tokens = 8, 64
    q = torch.randint(1, k + 2, (num_reqs,), generator=gen) if drafts else torch.ones(num_reqs, dtype=torch.int64)
    qsl = torch.zeros(max_rows + 1, dtype=torch.int32)
    qsl[1 : num_reqs + 1] = q.cumsum(0).to(torch.int32)
    qsl[num_reqs + 1 :] = qsl[num_reqs]
    num_tokens = int(qsl[num_reqs])
    token_rows = torch.zeros(max_tokens, dtype=torch.int64)
    token_rows[:num_tokens] = torch.repeat_interleave(torch.arange(num_reqs), q)
    step_out = torch.randint(0, 1000, (max_rows, k + 3), generator=gen)
    # the last step emitted 1..q tokens a row (its accepted drafts + 1); room to grow within the block table
    step_out[:num_reqs, k + 1] = (torch.rand(num_reqs, generator=gen) * q).long() + 1
    # each row's last query (q tokens) started at 0 or later; its next one ends inside the block table
    seq_lens = torch.randint(k + 1 + block_size, block_size * (max_blocks // 2), (max_rows,), generator=gen)
    return {"step_out": step_out, "query_start_loc": qsl, "token_req_indices": token_rows,
            "seq_lens": seq_lens.to(torch.int32),
            "positions": torch.randint(0, 99, (max_tokens,), generator=gen),
            "slot_mapping": torch.randint(0, 99, (max_tokens,), generator=gen),
            "input_ids": torch.randint(0, 99, (max_tokens,), generator=gen),
            "block_table": torch.randint(1, 500, (max_rows, max_blocks), generator=gen, dtype=torch.int32),
            "draft_rows": torch.randperm(max_rows, generator=gen),
            "draft_tokens": torch.randint(0, 1000, (max_rows, k), generator=gen),
            "num_accepted": torch.randint(0, 9, (max_rows,), generator=gen, dtype=torch.int32),
            "num_tokens": num_tokens}


def check_advance(device: str) -> None:
    """The kernel leaves every buffer as the torch path does (the conv graphs' accepted counts where given); rows
    past R and tokens past T untouched."""
    gen = torch.Generator().manual_seed(0)
    for num_reqs in (1, 2, 5, 8):
        for k, block_size, drafts in ((4, 4, True), (1, 16, True), (7, 1, True), (0, 4, False), (3, 16, False)):
            start = _batch(gen, num_reqs, k, block_size, 24, drafts)
            num_tokens = start.pop("num_tokens")
            results = []
            for advance in (verify_advance.advance_verify_rows, verify_advance.advance_verify_rows_triton):
                b = {name: t.clone().to(device) for name, t in start.items()}
                advance(b["step_out"], k + 1, num_reqs, num_tokens, b["query_start_loc"], b["token_req_indices"],
                        b["seq_lens"], b["positions"], b["slot_mapping"], b["input_ids"], b["block_table"],
                        b["draft_rows"], b["draft_tokens"] if drafts else None, block_size,
                        b["num_accepted"] if block_size != 16 else None)  # a target with conv state, or not
                results.append({name: t.cpu() for name, t in b.items()})
            where = f"R={num_reqs} k={k} B={block_size} drafts={drafts}"
            for name in start:
                assert torch.equal(results[0][name], results[1][name]), f"{name}: {where}"
            for name in ("positions", "slot_mapping", "input_ids"):
                assert torch.equal(results[1][name][num_tokens:], start[name][num_tokens:]), f"{name} past T: {where}"
            assert torch.equal(results[1]["seq_lens"][num_reqs:], start["seq_lens"][num_reqs:]), where
            assert torch.equal(results[1]["num_accepted"][num_reqs:], start["num_accepted"][num_reqs:]), where
            assert not torch.equal(results[1]["positions"][:num_tokens], start["positions"][:num_tokens]), where


def check_prefill_regions(device: str) -> None:
    """`advance_prefill_regions_triton`'s kernel leaves the draft prefill's buffers as the torch path does, from a
    target batch of uniform queries; rows past R and slots past S untouched."""
    gen = torch.Generator().manual_seed(1)
    for num_reqs in (1, 3, 8):
        for q, block_size in ((2, 4), (5, 16), (9, 1), (1, 4)):
            target = _batch(gen, num_reqs, q - 1, block_size, 24, True)
            qsl = torch.zeros(9, dtype=torch.int32)
            qsl[: num_reqs + 1] = torch.arange(num_reqs + 1, dtype=torch.int32) * q
            qsl[num_reqs + 1 :] = num_reqs * q
            num_slots = num_reqs * (q + 1)
            start = {"region_qsl": torch.arange(9, dtype=torch.int32) * (q + 1),
                     "region_rows": torch.arange(80) // (q + 1), "seq_lens": torch.randint(0, 99, (8,), generator=gen,
                                                                                          dtype=torch.int32),
                     "positions": torch.randint(0, 99, (80,), generator=gen),
                     "slot_mapping": torch.randint(0, 99, (80,), generator=gen),
                     "block_table": torch.randint(1, 500, (8, 24), generator=gen, dtype=torch.int32),
                     "start": torch.randint(0, 99, (8,), generator=gen)}
            results = []
            for advance in (verify_advance.advance_prefill_regions, verify_advance.advance_prefill_regions_triton):
                t = {name: target[name].to(device) for name in ("seq_lens", "block_table")}
                b = {name: x.clone().to(device) for name, x in start.items()}
                advance(qsl.to(device), t["seq_lens"], t["block_table"], num_reqs, num_slots, b["region_qsl"],
                        b["region_rows"], b["seq_lens"], b["positions"], b["slot_mapping"], b["block_table"],
                        b["start"], block_size, q + 1)
                results.append({name: x.cpu() for name, x in b.items()})
            where = f"R={num_reqs} q={q} B={block_size}"
            for name in start:
                assert torch.equal(results[0][name], results[1][name]), f"{name}: {where}"
            assert torch.equal(results[1]["positions"][num_slots:], start["positions"][num_slots:]), where
            assert torch.equal(results[1]["block_table"][num_reqs:], start["block_table"][num_reqs:]), where
            assert torch.equal(results[1]["block_table"][:num_reqs], target["block_table"][:num_reqs]), where


def test_advance_matches_torch_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_verify_advance", "check_advance")


def test_prefill_regions_match_torch_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_verify_advance", "check_prefill_regions")


@on_triton_gpu
def test_advance_matches_torch_on_gpu():
    check_advance("cuda")


@on_triton_gpu
def test_prefill_regions_match_torch_on_gpu():
    check_prefill_regions("cuda")


def test_the_kernel_compiles_for_a_hopper_block():
    if not verify_advance.AVAILABLE:
        pytest.skip("triton is not installed")
    signature = {"step_out_ptr": "*i64", "qsl_ptr": "*i32", "seq_lens_ptr": "*i32", "positions_ptr": "*i64",
                 "slot_mapping_ptr": "*i64", "input_ids_ptr": "*i64", "block_table_ptr": "*i32",
                 "draft_rows_ptr": "*i64", "draft_tokens_ptr": "*i64", "num_accepted_ptr": "*i32", "stride_out": "i32",
                 "num_sampled_col": "i32",
                 "stride_table": "i32", "stride_draft_rows": "i32", "stride_drafts": "i32", "block_size": "i32"}
    shared = hopper_shared_bytes(verify_advance._advance_verify_kernel, signature,
                                 {"HAS_DRAFTS": True, "HAS_CONV": True, "BLOCK": 32}, 1)
    assert shared <= HOPPER_SHARED_BYTES
