"""The draft's bookkeeping between decode steps in one Triton kernel (`engine.draft_step_kernel=triton`,
`specexp.engine.triton_draft_step`) against the torch path (`draft_advance.advance_draft_rows`): the same buffers
for random rows (block boundaries, rows that do not write, padded rows past R untouched) and the same tokens
from whole engines; under Triton's CPU interpreter, on a GPU, and compiled for a Hopper GPU without one."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    engines_emit_the_same_tokens,
    hopper_shared_bytes,
    on_triton_gpu,
    run_in_triton_interpreter,
)

from specexp.engine import triton_draft_step
from specexp.engine.draft_advance import advance_draft_rows


def _buffers(gen: torch.Generator, max_rows: int, k: int, block_size: int, max_blocks: int) -> dict:
    """The decode buffers of `max_rows` rows: positions that land on and next to block boundaries."""
    positions = torch.randint(0, block_size * (max_blocks - 1) - 1, (max_rows,), generator=gen)
    positions[:2] = torch.tensor([block_size - 1, 2 * block_size - 2])  # the next position opens a block / not
    return {"draft_tokens": torch.randint(0, 1000, (max_rows, k), generator=gen),
            "input_ids": torch.randint(0, 1000, (max_rows,), generator=gen), "positions": positions,
            "seq_lens": (positions + 1).to(torch.int32),
            "block_table": torch.randint(1, 500, (max_rows, max_blocks), generator=gen, dtype=torch.int32),
            "writes": torch.rand(max_rows, generator=gen) < 0.7,
            "slot_mapping": torch.randint(0, 99, (max_rows,), generator=gen)}


def check_advance(device: str) -> None:
    """The kernel leaves every buffer as the torch path does, for R = 1..70 rows of 80 (rows past R untouched),
    at every step of a K = 4 draft, block sizes 1 and 16."""
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 2, 5, 64, 65, 70):
        for block_size in (1, 16):
            start = _buffers(gen, 80, 4, block_size, 12)
            for step in range(1, 5):
                results = []
                for advance in (advance_draft_rows, triton_draft_step.advance_draft_rows):
                    b = {name: t.clone().to(device) for name, t in start.items()}
                    advance(b["draft_tokens"], step, b["input_ids"][:rows], b["positions"][:rows],
                            b["seq_lens"][:rows], b["block_table"][:rows], b["writes"][:rows],
                            b["slot_mapping"][:rows], block_size)
                    results.append({name: t.cpu() for name, t in b.items()})
                for name in start:
                    assert torch.equal(results[0][name], results[1][name]), f"{name}: R={rows} B={block_size}"
                    assert torch.equal(results[1][name][rows:], start[name][rows:]), f"{name} past R={rows}"


def check_engines(device: str) -> None:
    """Engines whose speculator advances its rows with the kernel emit the torch path's tokens: greedy and at
    T = 1, k = 4, a hybrid draft and a changing batch."""
    engines_emit_the_same_tokens(device, {"advance": triton_draft_step.advance_draft_rows},
                                 num_speculative_tokens=4, max_new_tokens=14)


def test_advance_matches_torch_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_draft_step", "check_advance")


def test_engines_match_torch_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_draft_step", "check_engines")


@on_triton_gpu
def test_advance_matches_torch_on_gpu():
    check_advance("cuda")


@on_triton_gpu
def test_engines_match_torch_on_gpu():
    check_engines("cuda")


def test_the_kernel_compiles_for_a_hopper_block():
    if not triton_draft_step.AVAILABLE:
        pytest.skip("triton is not installed")
    signature = {"draft_tokens_ptr": "*i64", "input_ids_ptr": "*i64", "positions_ptr": "*i64",
                 "seq_lens_ptr": "*i32", "block_table_ptr": "*i32", "writes_ptr": "*u8", "slot_mapping_ptr": "*i64",
                 "num_rows": "i32", "column": "i32", "stride_drafts": "i32", "stride_table": "i32",
                 "block_size": "i32"}
    shared = hopper_shared_bytes(triton_draft_step._advance_kernel, signature,
                                 {"BLOCK": triton_draft_step.ROWS_PER_PROGRAM}, 1)
    assert shared <= HOPPER_SHARED_BYTES

