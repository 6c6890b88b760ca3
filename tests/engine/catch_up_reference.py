"""A per-row reading of `specexp.engine.draft_catch_up`'s rule, and random inputs for it (shared by the engine's
torch tests and the Triton kernel's interpreter and GPU checks)."""

from __future__ import annotations

import torch


def random_case(seed: int, num_reqs: int, padded: int, q: int, block_size: int, num_blocks: int,
                copy_table: bool, device: str = "cpu") -> dict:
    """Inputs of `place_last_two` for num_reqs uniform verify rows of q target inputs, padded to `padded` rows;
    output buffers pre-filled with -7 so that anything written where it should not be shows."""
    gen = torch.Generator().manual_seed(seed)
    k = q - 1
    # start + q + 1 keys must fit the row's blocks
    start = torch.randint(0, num_blocks * block_size - q - 1, (padded,), generator=gen)
    table = torch.randint(0, 50, (padded, num_blocks), generator=gen, dtype=torch.int32)
    case = {
        "seq_src": (start + (q if copy_table else 2)).to(torch.int32),
        "seq_offset": -q if copy_table else -2,
        "num_reqs": num_reqs, "q": q,
        # 0: a row that emitted nothing; a strided column, as the engine's read-back buffer holds it
        "num_sampled": torch.randint(0, q + 1, (padded, 3), generator=gen)[:, 1],
        "sampled": torch.randint(-1, 30, (padded, k + 1), generator=gen),
        "target_input_ids": torch.randint(0, 30, (max(num_reqs * q, 1),), generator=gen),
        "block_table": (torch.full_like(table, -3) if copy_table else table.clone()),
        "block_size": block_size,
        "positions": torch.full((2 * padded + 3,), -7), "seq_lens": torch.full((padded,), -7, dtype=torch.int32),
        "slot_mapping": torch.full((2 * padded + 3,), -7), "input_ids": torch.full((2 * padded + 3,), -7),
        "rows": torch.full((padded,), -7), "start": torch.full((padded,), -7), "num_valid": torch.full((padded,), -7),
        "src_table": table if copy_table else None,
    }
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in case.items()}


def reference(case: dict) -> dict:
    """What `place_last_two` leaves in each written buffer, row by row from the module doc's rule."""
    out = {name: case[name].clone().cpu() for name in ("positions", "seq_lens", "slot_mapping", "input_ids", "rows",
                                                       "start", "num_valid", "block_table")}
    table = (case["src_table"] if case["src_table"] is not None else case["block_table"]).cpu()
    if case["src_table"] is not None:
        out["block_table"][: case["num_reqs"]] = table[: case["num_reqs"]]
    block_size, q = case["block_size"], case["q"]
    out["rows"][case["num_reqs"]:] = 0
    for r in range(case["num_reqs"]):
        start = int(case["seq_src"][r]) + case["seq_offset"]
        valid = max(int(case["num_sampled"][r]), 1)
        first = start + valid - 1
        for i, position in enumerate((first, first + 1)):
            out["positions"][2 * r + i] = position
            out["slot_mapping"][2 * r + i] = int(table[r, position // block_size]) * block_size + position % block_size
        out["input_ids"][2 * r] = int(case["target_input_ids"][r * q + valid - 1])
        out["input_ids"][2 * r + 1] = max(int(case["sampled"][r, valid - 1]), 0)
        out["seq_lens"][r] = first + 2
        out["rows"][r] = 2 * r + 1
        out["start"][r] = start
        out["num_valid"][r] = valid
    return out


def check_against_reference(place, case: dict) -> None:
    """Run `place` (a `place_last_two` implementation) on case and compare every buffer with `reference`."""
    expected = reference(case)
    returned = place(**case)
    for name, tensor in expected.items():
        assert torch.equal(case[name].cpu(), tensor), (name, case[name], tensor)
    assert torch.equal(returned.cpu(), expected["num_valid"][: case["num_reqs"]])
