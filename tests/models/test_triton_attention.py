"""The Triton paged attention for uniform batches (`engine.attention_kernel=triton`) against the default
gather + SDPA path: on a GPU (`pytest -m cuda`) and, where triton is installed, under Triton's CPU
interpreter; the dispatch and the config's checks everywhere."""

from __future__ import annotations

import pytest
import torch
from test_attention import build_batch
from triton_interpreter import on_triton_gpu, run_in_triton_interpreter

from specexp.engine.config import EngineConfig, EngineConfigError
from specexp.models import triton_attention
from specexp.models.attention import SDPA, TRITON, attend, padding_slot, paged_attention, write_kv_cache
from specexp.models.config import RopeConfig
from specexp.models.layers import RotaryEmbedding
from specexp.models.pointwise import apply_rope, rms_norm

# (queries per row, context lengths, Hq, Hkv, head dim, padded rows, cache block size): decode and verify rows,
# GQA groups, a head dim that is not a power of 2, rows over several cache blocks and key tiles, graph padding,
# blocks smaller than a key tile and not a power of 2; keys split over programs (`num_key_splits`) from the third
# case on, the last with more tiles than splits (several tiles a program) beside a row of fewer
CASES = [(1, [5, 0, 40], 4, 2, 8, 0, 16), (1, [17], 8, 8, 64, 3, 16), (5, [3, 33, 60], 6, 2, 24, 1, 16),
         (3, [0, 15], 4, 1, 16, 0, 16), (4, [9, 50, 100], 4, 2, 32, 2, 8), (1, [130], 2, 1, 16, 0, 5),
         (2, [1100, 300], 4, 2, 32, 1, 16)]


def check_against_sdpa(device: str, dtype: torch.dtype, tol: float, max_splits: int = 16) -> None:
    """Every CASES batch, both ways the kernel runs: attending over keys already written, and writing this
    step's keys/values itself first (the engine's path), with a row's keys split over up to `max_splits` programs
    (`triton_attention.MAX_SPLITS`) however few they are (MIN_SPLIT_KEYS 0). Real rows equal the default path's
    outputs, padded rows stay finite, and the written cache equals the default write outside the NULL block."""
    shipped = triton_attention.MAX_SPLITS, triton_attention.MIN_SPLIT_KEYS
    triton_attention.MAX_SPLITS, triton_attention.MIN_SPLIT_KEYS = max_splits, 0
    try:
        _check_cases_against_sdpa(device, dtype, tol)
    finally:
        triton_attention.MAX_SPLITS, triton_attention.MIN_SPLIT_KEYS = shipped


def _check_cases_against_sdpa(device: str, dtype: torch.dtype, tol: float) -> None:
    for seed, (q_len, contexts, hq, hkv, dim, pad_rows, block_size) in enumerate(CASES):
        kv_cache, meta, q, k, v, positions, _ = build_batch(
            [q_len] * len(contexts), contexts, hq, hkv, dim, block_size=block_size, num_blocks=120,
            pad_rows=pad_rows, pad_tokens=pad_rows * q_len, seed=seed, max_query_len=q_len,
            max_blocks=-(-(max(contexts) + q_len) // block_size) + 1)
        num_blocks = meta.block_table.shape[1]  # every row walks its whole table: later blocks are masked
        meta.max_seq_len = num_blocks * block_size
        moved = {name: value.to(device) for name, value in vars(meta).items() if isinstance(value, torch.Tensor)}
        for name, value in moved.items():
            setattr(meta, name, value)
        kv_cache, q, k, v, positions = (t.to(device=device) for t in (kv_cache, q, k, v, positions))
        kv_cache, q, k, v = (t.to(dtype) for t in (kv_cache, q, k, v))
        slots = meta.slot_mapping
        write_index = torch.where(slots < 0, padding_slot(block_size), slots)
        fresh = kv_cache.clone()
        write_kv_cache(kv_cache, k, v, slots)
        expected = paged_attention(q, positions, kv_cache, meta, scale=dim**-0.5)
        assert triton_attention.supports(q, kv_cache, q_len, k, v)
        real = meta.num_actual_tokens
        label = f"case {seed} ({q_len} queries/row, Hq {hq}, Hkv {hkv}, D {dim}, block {block_size}) {dtype}"
        written = {}
        for writes in (None, "mapped", "raw"):  # the padding's -1 slots as given, or mapped by the caller
            cache = fresh.clone() if writes else kv_cache
            index = {"mapped": write_index, "raw": slots}.get(writes)
            new_kv = {"key": k, "value": v, "write_index": index} if writes else {}
            got = triton_attention.paged_attention_uniform(q, positions, cache, meta.block_table, meta.seq_lens,
                                                           num_blocks=num_blocks, scale=dim**-0.5, **new_kv)
            assert got.shape == expected.shape and got.dtype == dtype and torch.isfinite(got).all()
            err = (got[:real].double() - expected[:real].double()).abs().max().item()
            assert err < tol, f"{label}, kernel writes K/V: {writes}: error {err:.2e}"
            assert torch.equal(cache[:, 1:], kv_cache[:, 1:]), f"{label}: cache differs outside the NULL block"
            written[writes] = cache
        # Padding tokens all land in the NULL block's scratch slot, which no row reads: on a GPU which of them
        # writes it last is a race, so the slot itself is left out; every other slot must match.
        raw, mapped = (written[w].flatten(1, 2).clone() for w in ("raw", "mapped"))
        for flat in (raw, mapped):
            flat[:, padding_slot(block_size)] = 0
        assert torch.equal(raw, mapped), f"{label}: -1 slots not mapped to the scratch slot"
        # In-kernel prologue: q and k given before their per-head norms (or none) and RoPE; the reference applies
        # the eager ops first.
        rotary = RotaryEmbedding(RopeConfig(theta=500.0), dim).to(device)
        cos, signed_sin = rotary(positions, dtype)
        raw_q, raw_k = q.flip(-1), k.flip(-1)  # any values
        gen = torch.Generator().manual_seed(seed)
        q_weight, k_weight = ((torch.rand(dim, generator=gen) + 0.5).to(device=device, dtype=dtype) for _ in "qk")
        for with_norm in (False, True):
            qn, kn = (rms_norm(raw_q, q_weight, 1e-5), rms_norm(raw_k, k_weight, 1e-5)) if with_norm else (raw_q, raw_k)
            rotated_cache = fresh.clone()
            write_kv_cache(rotated_cache, apply_rope(kn, cos, signed_sin), v, slots)
            expected = paged_attention(apply_rope(qn, cos, signed_sin), positions, rotated_cache, meta,
                                       scale=dim**-0.5)
            prologue = {"rope_inv_freq": rotary.inv_freq,
                        "qk_norm": (q_weight, k_weight, 1e-5) if with_norm else None}
            assert triton_attention.supports(raw_q, kv_cache, q_len, raw_k, v, **prologue)
            cache = fresh.clone()
            got = triton_attention.paged_attention_uniform(
                raw_q, positions, cache, meta.block_table, meta.seq_lens, num_blocks=num_blocks, scale=dim**-0.5,
                key=raw_k, value=v, write_index=write_index, **prologue)
            err = (got[:real].double() - expected[:real].double()).abs().max().item()
            assert err < tol, f"{label}, in-kernel RoPE, q/k norms: {with_norm}: error {err:.2e}"
            cache_err = (cache[:, 1:].double() - rotated_cache[:, 1:].double()).abs().max().item()
            scale = rotated_cache[:, 1:].abs().max().item()  # half precision: an ulp of the largest key
            assert cache_err <= tol * max(scale, 1), f"{label}, q/k norms: {with_norm}: keys differ by {cache_err:.2e}"


def check_split_keys(device: str) -> None:
    """Keys split over programs give the one-program result (MAX_SPLITS = 1) within fp32 rounding, one counter
    buffer serves consecutive launches (each leaves it zero), and a row whose tiles are fewer than the splits
    leaves the programs past them idle."""
    kv_cache, meta, q, k, v, positions, _ = build_batch(
        [5, 5], [1100, 20], 8, 2, 64, block_size=16, num_blocks=80, seed=3, max_query_len=5, max_blocks=72)
    tensors = [t.to(device) for t in (kv_cache, q, k, v, positions, meta.block_table, meta.seq_lens)]
    kv_cache, q, k, v, positions, block_table, seq_lens = tensors
    index = meta.slot_mapping.to(device)
    counters = torch.zeros(2 * 2, dtype=torch.int32, device=device)
    outs, shipped = {}, triton_attention.MAX_SPLITS
    try:
        for max_splits in (1, 16, 16):  # 18 tiles: 2 a program
            triton_attention.MAX_SPLITS = max_splits
            assert triton_attention.num_key_splits(72 * 16, 2, 2) == max_splits
            cache = kv_cache.clone()
            outs.setdefault(max_splits, []).append(triton_attention.paged_attention_uniform(
                q, positions, cache, block_table, seq_lens, 72, 64**-0.5, key=k, value=v, write_index=index,
                split_counters=lambda count: counters[:count]))
            assert not counters.any(), f"splits {max_splits}: counters left at {counters.tolist()}"
    finally:
        triton_attention.MAX_SPLITS = shipped
    one, (split, again) = outs[1][0], outs.pop(max(outs))
    assert torch.equal(split, again)
    assert (split - one).abs().max().item() < 1e-5


def check_load_ahead(device: str) -> None:
    """Loading each key tile one tile ahead (`triton_attention.LOAD_AHEAD`) gives bit for bit what loading it when
    its turn comes gives: the same outputs and cache, rows of one to many tiles, cache blocks smaller than a tile
    and not a power of 2, keys in one program and split over several (MIN_SPLIT_KEYS 0)."""
    shipped = triton_attention.LOAD_AHEAD, triton_attention.MAX_SPLITS, triton_attention.MIN_SPLIT_KEYS
    try:
        for block_size, contexts in ((16, [700, 64, 1, 130]), (5, [190, 63])):
            kv_cache, meta, q, k, v, positions, _ = build_batch(
                [2] * len(contexts), contexts, 4, 2, 32, block_size=block_size, num_blocks=200, seed=block_size,
                max_query_len=2, max_blocks=-(-(max(contexts) + 2) // block_size) + 1)
            tensors = [t.to(device) for t in (kv_cache, q, k, v, positions, meta.block_table, meta.seq_lens)]
            kv_cache, q, k, v, positions, block_table, seq_lens = tensors
            index = meta.slot_mapping.to(device)
            for max_splits in (1, 16):
                got = {}
                for ahead in (False, True):
                    triton_attention.LOAD_AHEAD, triton_attention.MAX_SPLITS = ahead, max_splits
                    triton_attention.MIN_SPLIT_KEYS = 0
                    cache = kv_cache.clone()
                    out = triton_attention.paged_attention_uniform(
                        q, positions, cache, block_table, seq_lens, block_table.shape[1], 32**-0.5, key=k, value=v,
                        write_index=index)
                    got[ahead] = out, cache
                label = f"blocks of {block_size}, contexts {contexts}, splits {max_splits}"
                assert torch.equal(got[True][0], got[False][0]), f"{label}: outputs differ"
                assert torch.equal(got[True][1][:, 1:], got[False][1][:, 1:]), f"{label}: caches differ"
    finally:
        triton_attention.LOAD_AHEAD, triton_attention.MAX_SPLITS, triton_attention.MIN_SPLIT_KEYS = shipped


def test_loading_tiles_ahead_changes_nothing_in_triton_interpreter():
    run_in_triton_interpreter('test_triton_attention', 'check_load_ahead')


@on_triton_gpu
def test_loading_tiles_ahead_changes_nothing_on_gpu():
    check_load_ahead("cuda")


def test_how_many_programs_split_a_launch_keys():
    """One program below MIN_SPLIT_KEYS; else one per key tile, at most MAX_SPLITS, fewer when rows x KV heads
    already fill SPLIT_PROGRAMS programs."""
    tile, floor = triton_attention.KEYS_PER_TILE, triton_attention.MIN_SPLIT_KEYS
    assert triton_attention.num_key_splits(floor - 1, 1, 8) == 1
    assert triton_attention.num_key_splits(floor, 1, 8) == min(triton_attention.MAX_SPLITS, floor // tile)
    assert triton_attention.num_key_splits(4096, 1, 8) == triton_attention.MAX_SPLITS
    assert triton_attention.num_key_splits(4096, 8, 8) == triton_attention.SPLIT_PROGRAMS // 64
    assert triton_attention.num_key_splits(4096, 64, 8) == 1


def test_keys_split_over_programs_in_triton_interpreter():
    run_in_triton_interpreter('test_triton_attention', 'check_split_keys')


@on_triton_gpu
def test_keys_split_over_programs_on_gpu():
    check_split_keys("cuda")


@on_triton_gpu
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
def test_triton_attention_matches_sdpa_on_gpu(dtype, tol):
    for max_splits in (1, 16):
        check_against_sdpa("cuda", dtype, tol, max_splits)


@on_triton_gpu
@pytest.mark.parametrize("query_len, context, hq, hkv", [(64, 0, 8, 2), (64, 37, 8, 2), (50, 20, 4, 1), (128, 5, 4, 2)])
def test_long_uniform_rows_attend_through_the_kernel_over_sub_rows(query_len, context, hq, hkv):
    """A prompt chunk of Q queries whose G * Q exceeds one program's rows (`MAX_QUERY_ROWS`): `attend` cuts the row
    into sub-rows for the kernel, with the same outputs and cache as the gather + SDPA path."""
    dim, block_size = 64, 16
    kv_cache, meta, q, k, v, positions, _ = build_batch(
        [query_len], [context], hq, hkv, dim, block_size=block_size, num_blocks=40, max_query_len=query_len,
        max_blocks=-(-(query_len + context) // block_size) + 1)
    assert (hq // hkv) * query_len > triton_attention.MAX_QUERY_ROWS
    meta.max_seq_len = meta.block_table.shape[1] * block_size
    for name, value in vars(meta).items():
        if isinstance(value, torch.Tensor):
            setattr(meta, name, value.cuda())
    kv_cache, q, k, v, positions = (t.cuda() for t in (kv_cache, q, k, v, positions))
    caches = {kernel.name: kv_cache.clone() for kernel in (SDPA, TRITON)}
    outs = {kernel.name: attend(q, k, v, positions, caches[kernel.name], meta, dim**-0.5, kernel=kernel)
            for kernel in (SDPA, TRITON)}
    assert (outs["triton"] - outs["sdpa"]).abs().max().item() < 1e-5
    assert torch.equal(caches["triton"], caches["sdpa"])


def test_triton_attention_matches_sdpa_in_triton_interpreter():
    """The kernel's arithmetic on CPU tensors, in Triton's interpreter (skipped without triton)."""
    for max_splits in ("1", "16"):
        run_in_triton_interpreter('test_triton_attention', 'check_against_sdpa', "torch.float32", "1e-5", max_splits)


def test_in_kernel_rope_needs_the_new_keys():
    q = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="need this step's keys"):
        triton_attention.paged_attention_uniform(q, torch.zeros(1, dtype=torch.int64), torch.zeros(2, 2, 4, 1, 8),
                                                 torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                                                 1, 1.0, rope_inv_freq=torch.ones(4))


def test_attention_kernel_is_validated():
    with pytest.raises(EngineConfigError, match="engine.attention_kernel='flash'.*'sdpa', 'triton'"):
        EngineConfig(attention_kernel="flash").validate()
    with pytest.raises(EngineConfigError, match="engine.attention_kernel='triton' needs engine.device=cuda"):
        EngineConfig(device="cpu", attention_kernel="triton").validate()


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_kernel_compiles_for_a_hopper_block(dtype):
    """Compiled for sm_90 without a GPU, the kernel builds in the engine's configurations (a decode row and a
    verify row of Llama-3.2-1B's heads, writing this step's keys with -1 padding slots, with the in-kernel RoPE
    and q/k norms or not; small heads at few tokens, 4 and 8 warps) and fits a Hopper block's shared memory."""
    if not triton_attention.AVAILABLE:
        pytest.skip("triton is not installed")
    from triton_interpreter import HOPPER_SHARED_BYTES, hopper_shared_bytes

    half = f"*{dtype}"
    pointers = {"q_ptr": half, "kv_ptr": half, "block_table_ptr": "*i32", "seq_lens_ptr": "*i32",
                "positions_ptr": "*i64", "out_ptr": half, "new_k_ptr": half, "new_v_ptr": half,
                "write_index_ptr": "*i64", "inv_freq_ptr": "*fp32", "q_norm_ptr": half, "k_norm_ptr": half,
                "part_ptr": "*fp32", "ml_ptr": "*fp32", "counter_ptr": "*i32"}
    ints = ("stride_qt", "stride_qh", "stride_kv", "stride_kb", "stride_ks", "stride_kh", "stride_bt", "stride_ot",
            "stride_nkt", "stride_nkh", "stride_nvt", "stride_nvh")
    signature = {**pointers, **dict.fromkeys(ints, "i32"), "scale": "fp32", "num_keys": "i32", "eps": "fp32"}
    # Llama-3.2-1B's heads (32 query heads over 8 KV heads, dim 64) at a decode row and verify rows, with the
    # in-kernel RoPE and q/k norms or not; small heads (the zoo's tiny models) at 1-2 tokens, where a program's
    # tile of its tokens' RoPE tables holds fewer elements than its threads unless `token_rows` pads it
    shapes = [(queries, 4, 64, prologue, split, 4) for queries, prologue, split in (
        (1, True, False), (5, True, False), (5, False, False), (1, True, True), (5, True, True))]
    shapes += [(queries, group, head_dim, True, False, warps) for queries, group, head_dim, warps in (
        (1, 2, 8, 4), (2, 2, 32, 4), (3, 4, 16, 4), (1, 4, 64, 8), (9, 4, 64, 4))]
    for queries, group, head_dim, prologue, split, warps in shapes:
        block_d = max(16, triton_attention.triton.next_power_of_2(head_dim))
        constexprs = {"Q": queries, "G": group, "D": head_dim, "BLOCK_SIZE": 16,
                      "BLOCK_M": max(16, triton_attention.triton.next_power_of_2(group * queries)),
                      "BLOCK_N": triton_attention.KEYS_PER_TILE, "BLOCK_D": block_d,
                      "BLOCK_Q": triton_attention.token_rows(queries, block_d, prologue, warps), "WRITE_KV": True,
                      "QK_NORM": prologue, "ROPE": prologue, "ROUND_HALF": dtype == "bf16", "IEEE": dtype == "fp32",
                      "SPLIT": split, "AHEAD": triton_attention.LOAD_AHEAD}
        shared = hopper_shared_bytes(triton_attention._paged_attention_kernel, signature, constexprs, warps)
        label = f"Q={queries} G={group} D={head_dim} prologue={prologue} split={split} warps={warps}"
        assert shared <= HOPPER_SHARED_BYTES, f"{label}: {shared} bytes"
