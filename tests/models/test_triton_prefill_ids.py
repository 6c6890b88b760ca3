"""The draft prefill's input ids from a verify (`draft_advance.fill_prefill_ids`, its Triton kernel
`triton_draft_step.fill_prefill_ids` under `engine.draft_step_kernel=triton`) against a per-slot Python reading
of the rule: random batches of verify and prompt rows, contiguous regions and strided ones (a joined graph's
chunk segment), padded rows; the torch path as a property test, the kernel under Triton's CPU interpreter, on a
GPU and compiled for a Hopper GPU without one; and whole engines emitting the same tokens either way."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    engines_emit_the_same_tokens,
    hopper_shared_bytes,
    on_triton_gpu,
    run_in_triton_interpreter,
)

from specexp.engine import triton_draft_step
from specexp.engine.draft_advance import fill_prefill_ids, prefill_regions


def make_case(rng: random.Random, num_reqs: int, stride: bool) -> dict:
    """A batch of num_reqs rows (each a verify row of q = k + 1 tokens with 1..q sampled, or a prompt chunk),
    staged as the speculator stages it, with output buffers holding garbage."""
    k = rng.randint(0, 5)
    query_lens = [k + 1 if rng.random() < 0.7 else rng.randint(1, 9) for _ in range(num_reqs)]
    is_spec = [int(q == k + 1 and rng.random() < 0.9) for q in query_lens]
    row_stride = max(query_lens) + 1 + rng.randint(0, 2) if stride else None
    region_row, region_i, src, region_start = prefill_regions(query_lens, row_stride)
    target_start = sum(query_lens)
    starts = [rng.randint(0, 50) for _ in range(num_reqs)]
    samples = [rng.randint(0, 1) for _ in range(num_reqs)]
    staged = torch.tensor(region_row + region_i + src + query_lens + is_spec + region_start + starts + samples)
    width = max(query_lens) + 1
    # num_sampled as the engine passes it: a column of the step's output (strided)
    step_out = torch.tensor([[rng.randint(1, q), 0, 0] for q in query_lens])
    return {"staged": staged, "num_slots": len(region_row), "num_reqs": num_reqs, "num_sampled": step_out[:, 0],
            "sampled": torch.tensor([[rng.randint(-1, 999) for _ in range(width)] for _ in range(num_reqs)]),
            "target_input_ids": torch.tensor([rng.randint(0, 999) for _ in range(target_start)]),
            "input_ids": torch.full((num_reqs * (row_stride or width) + 4,), 7777),
            "rows": torch.full((num_reqs + rng.randint(0, 3),), 5555), "token_offset": rng.randint(0, 3),
            "query_lens": query_lens, "is_spec": is_spec, "region_start": region_start}


def expected(case: dict) -> tuple[list[int], list[int], list[int]]:
    """(input_ids, rows, num_valid) by the rule, slot by slot."""
    ids, rows = case["input_ids"].tolist(), [0] * case["rows"].numel()
    num_sampled, sampled = case["num_sampled"].tolist(), case["sampled"].tolist()
    target, valid = case["target_input_ids"].tolist(), []
    src_start = 0
    for r, q in enumerate(case["query_lens"]):
        v = num_sampled[r] if case["is_spec"][r] else q
        valid.append(v)
        new_token = max(sampled[r][max(num_sampled[r] - 1, 0)], 0)
        for i in range(q + 1):
            ids[case["region_start"][r] + i] = (target[src_start + min(i, q - 1)] if i < v
                                                else new_token if i == v else 0)
        rows[r] = case["region_start"][r] + case["token_offset"] + v
        src_start += q
    return ids, rows, valid


def run_fill(fill, case: dict, device: str) -> tuple[list[int], list[int], list[int]]:
    on = {name: case[name].to(device) for name in ("staged", "sampled", "target_input_ids", "input_ids", "rows")}
    on["num_sampled"] = torch.stack([case["num_sampled"]] * 3, dim=1).to(device)[:, 1]  # strided, as the engine's
    num_valid = fill(on["staged"], case["num_slots"], case["num_reqs"], on["num_sampled"], on["sampled"],
                     on["target_input_ids"], on["input_ids"], on["rows"], case["token_offset"])
    return on["input_ids"].tolist(), on["rows"].tolist(), num_valid.tolist()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), num_reqs=st.integers(1, 6), stride=st.booleans())
def test_the_torch_path_follows_the_rule(seed, num_reqs, stride):
    case = make_case(random.Random(seed), num_reqs, stride)
    assert run_fill(fill_prefill_ids, case, "cpu") == expected(case)


def check_kernel(device: str) -> None:
    """The kernel writes what the rule says for 200 random batches (1..70 rows: past one 64-slot block)."""
    rng = random.Random(0)
    for n in range(200):
        case = make_case(rng, rng.choice([1, 2, 3, 5, 17, 70]), stride=n % 3 == 0)
        assert run_fill(triton_draft_step.fill_prefill_ids, case, device) == expected(case), f"case {n}"


def check_engines(device: str) -> None:
    """Engines whose speculator fills its prefill inputs with the kernel emit the torch path's tokens: greedy
    and at T = 1, k = 3, a hybrid draft and a changing batch."""
    engines_emit_the_same_tokens(device, {"fill_prefill_ids": triton_draft_step.fill_prefill_ids},
                                 num_speculative_tokens=3, max_new_tokens=12)


def test_the_kernel_follows_the_rule_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_prefill_ids", "check_kernel")


def test_engines_match_torch_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_prefill_ids", "check_engines")


@on_triton_gpu
def test_the_kernel_follows_the_rule_on_gpu():
    check_kernel("cuda")


@on_triton_gpu
def test_engines_match_torch_on_gpu():
    check_engines("cuda")


def test_the_kernel_compiles_for_a_hopper_block():
    if not triton_draft_step.AVAILABLE:
        pytest.skip("triton is not installed")
    pointers = ("staged_ptr", "num_sampled_ptr", "sampled_ptr", "target_ids_ptr", "input_ids_ptr", "rows_ptr",
                "num_valid_ptr")
    signature = {**{name: "*i64" for name in pointers}, "num_slots": "i32", "num_reqs": "i32", "num_rows": "i32",
                 "stride_num_sampled": "i32", "stride_sampled": "i32", "stride_target": "i32", "token_offset": "i32"}
    assert hopper_shared_bytes(triton_draft_step._prefill_ids_kernel, signature, {"BLOCK": 1024}, 4) \
        <= HOPPER_SHARED_BYTES
