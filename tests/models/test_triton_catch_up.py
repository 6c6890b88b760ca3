"""The draft's two-slot prefill regions in one Triton kernel (`specexp.engine.draft_catch_up`,
`engine.draft_step_kernel=triton`): every buffer as the rule's per-row reading says (random rows, padding, block
sizes, the block table copied from the target's or not) and whole engines' tokens as the torch path's; under
Triton's CPU interpreter, on a GPU, and compiled for a Hopper GPU without one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    engines_emit_the_same_tokens,
    hopper_shared_bytes,
    on_triton_gpu,
    run_in_triton_interpreter,
)

from specexp.engine import draft_catch_up

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))  # the engine tests' reading of the rule
from catch_up_reference import check_against_reference, random_case


def check_regions(device: str) -> None:
    """R = 0..5 rows padded by up to 3, q = 1..9, block sizes 1, 4 and 16, with and without the table's copy."""
    case_id = 0
    for num_reqs, pad in ((0, 1), (1, 0), (1, 3), (3, 1), (5, 2)):
        for q in (1, 2, 5, 9):
            for block_size in (1, 4, 16):
                for copy_table in (False, True):
                    num_blocks = -(-(q + 3) // block_size) + 2
                    case = random_case(case_id, num_reqs, num_reqs + pad, q, block_size, num_blocks, copy_table,
                                       device)
                    check_against_reference(draft_catch_up.place_last_two_triton, case)
                    case_id += 1


def check_engines(device: str) -> None:
    """Engines placing the regions with the kernel emit the torch path's tokens: greedy and at T = 1, k = 4 (an
    attention-only draft: the two-slot regions' only users)."""
    engines_emit_the_same_tokens(device, {"place_last_two": draft_catch_up.place_last_two_triton},
                                 num_speculative_tokens=4, max_new_tokens=14, draft="tiny-random-llama-draft")


def test_regions_follow_the_rule_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_catch_up", "check_regions")


def test_engines_match_torch_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_catch_up", "check_engines")


@on_triton_gpu
def test_regions_follow_the_rule_on_gpu():
    check_regions("cuda")


@on_triton_gpu
def test_engines_match_torch_on_gpu():
    check_engines("cuda")


def test_the_kernel_compiles_for_a_hopper_block():
    if not draft_catch_up.AVAILABLE:
        pytest.skip("triton is not installed")
    pointers = {"seq_src_ptr": "*i32", "num_sampled_ptr": "*i64", "sampled_ptr": "*i64", "target_ids_ptr": "*i64",
                "table_ptr": "*i32", "src_table_ptr": "*i32", "positions_ptr": "*i64", "seq_lens_ptr": "*i32",
                "slot_mapping_ptr": "*i64", "input_ids_ptr": "*i64", "rows_ptr": "*i64", "start_ptr": "*i64",
                "num_valid_ptr": "*i64"}
    ints = {name: "i32" for name in ("num_reqs", "seq_offset", "q", "stride_num_sampled", "stride_sampled", "stride_table",
                                     "stride_src_table", "num_blocks", "block_size")}
    for copy_table in (False, True):
        shared = hopper_shared_bytes(draft_catch_up._last_two_kernel, pointers | ints,
                                     {"COPY_TABLE": copy_table, "BLOCK_B": 128}, 1)
        assert shared <= HOPPER_SHARED_BYTES
