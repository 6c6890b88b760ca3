"""Paged attention for uniform batches (decode and verify steps) in one Triton kernel.

The default path (`specexp.models.attention.paged_attention`) gathers each row's keys and values out of the
paged cache into a dense tensor and runs SDPA on it: two kernels and a copy of every key per layer. Here the
programs of a (row, KV head) walk the row's block table, read each cache block where it lies and keep an
online softmax (flash-decoding): at batch 1 that is one small kernel per layer instead of a gather plus an SDPA
launch.

A program loads each tile of keys one tile ahead (`LOAD_AHEAD`): the tile's compute overlaps the next tile's round
trip to memory. Still, a program that walked a long context alone would take time in proportion to it at batch 1,
where a decode step has one program per KV head. The keys are split over up to `num_key_splits` programs (a
launch's grid axis 2): each walks its run of tiles, writes its partial softmax (max, sum, weighted values) and
counts itself done; the last to arrive merges the partials in split order and writes the output. A row whose keys
fill one tile keeps the one-program path (its other programs leave at once).

It also writes the step's keys and values into the cache (the engine's path: one kernel per layer for the KV
write and the attention; split, each new key by the program whose keys hold its position). Covers batches whose
rows all hold the same number of queries Q (row r's queries at tokens r*Q .. r*Q+Q-1), which is every decode and
verify step and every graph replay; the G query heads sharing a KV head and the Q queries of a row form the
program's G*Q query rows. Masking is the default path's: key j is visible to a query at position p when j <= p
and j < seq_len, and key 0 always is (padded rows stay finite). Programs walk only the row's tiles below seq_len:
a captured graph's key bound (its seq-len bucket) costs nothing past the row's actual context.

Importable without Triton (`AVAILABLE` False); the kernel needs a CUDA device or Triton's interpreter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specexp.models.triton_support import (
    AVAILABLE,
    arrive_last,
    early_launch_flags,
    tl,
    triton,
    wait_for_earlier_kernels,
)

MAX_QUERY_ROWS = 128  # G * Q per program: beyond this the default path is used
KEYS_PER_TILE = 64  # keys per online-softmax step (a multiple of 16 for tl.dot)
NUM_WARPS = 4  # warps per program
NUM_STAGES: int | None = None  # software-pipelining stages of the key loop (None: Triton's default)
MAX_SPLITS = 16  # programs one (row, KV head)'s keys may be split over (1: one program walks them all)
# Whether a program loads each key tile one tile ahead (while the tile before is computed) rather than when its turn
# comes. On an H100 (2026-12-07, experiments/2026-12-07-attention-prologue-h100/) it took 0.03-0.07 ms off a
# Llama-3.2-1B decode step at 1-1,024 keys; a verify of 9 tokens was within 0.014 ms either way.
LOAD_AHEAD = True
MIN_SPLIT_KEYS = 512  # launches over fewer keys (the smallest graph bucket, 256) keep one program
SPLIT_PROGRAMS = 256  # splitting stops once rows x KV heads x splits reaches this (about two programs an SM)


def num_key_splits(num_keys: int, num_rows: int, num_kv_heads: int) -> int:
    """Programs along the key axis of a launch over `num_keys` keys (the graph's bound, not a row's context): one
    per key tile up to MAX_SPLITS, fewer when rows x KV heads already fill SPLIT_PROGRAMS programs; one below
    MIN_SPLIT_KEYS. At batch 1 a decode step has one program per KV head (8 for Llama-3.2-1B), each walking its
    keys tile after tile, each tile a dependent round trip to memory; split, the tiles of a long context are read
    in parallel. On an H100 (2026-12-06) a Llama-3.2-1B step at 2,048 keys took 1.21 ms split against 2.24 ms
    not; at <= 64 keys split cost 0.01 ms more (the idle programs), hence the floor."""
    if num_keys < MIN_SPLIT_KEYS:
        return 1
    tiles = -(-num_keys // KEYS_PER_TILE)
    return max(1, min(MAX_SPLITS, tiles, SPLIT_PROGRAMS // max(num_rows * num_kv_heads, 1)))


if AVAILABLE:

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, kv_ptr, block_table_ptr, seq_lens_ptr, positions_ptr, out_ptr,
        new_k_ptr, new_v_ptr, write_index_ptr, inv_freq_ptr, q_norm_ptr, k_norm_ptr,
        stride_qt, stride_qh, stride_kv, stride_kb, stride_ks, stride_kh, stride_bt, stride_ot,
        stride_nkt, stride_nkh, stride_nvt, stride_nvh,
        scale, num_keys, eps, part_ptr, ml_ptr, counter_ptr,
        Q: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
        WRITE_KV: tl.constexpr, QK_NORM: tl.constexpr, ROPE: tl.constexpr, ROUND_HALF: tl.constexpr,
        IEEE: tl.constexpr, SPLIT: tl.constexpr = False, AHEAD: tl.constexpr = False,
        GDC: tl.constexpr = False,
    ):
        wait_for_earlier_kernels(GDC)  # launched early: every input may come from the kernel before
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        seq_len = tl.load(seq_lens_ptr + row)
        # keys at or past seq_len are masked: walk only the tiles below it (at least one: key 0 is always seen)
        key_end = tl.maximum(tl.minimum(num_keys, seq_len), 1)
        if SPLIT:
            # The row's tiles in `active` consecutive runs of `per_split` tiles, one per program along axis 2 (at
            # most its size); programs past them have no keys and leave at once.
            split = tl.program_id(2)
            num_tiles = tl.cdiv(key_end, BLOCK_N)
            per_split = tl.cdiv(num_tiles, tl.num_programs(2))
            active = tl.cdiv(num_tiles, per_split)
            if split >= active:
                return
            key_start = split * per_split * BLOCK_N
            key_stop = tl.minimum(key_start + per_split * BLOCK_N, key_end)
        else:
            key_start = 0
            key_stop = key_end
        m = tl.arange(0, BLOCK_M)  # query rows of this program: m = i * G + g
        d = tl.arange(0, BLOCK_D)
        m_ok = m < Q * G
        d_ok = d < D
        d_swapped = tl.where(d < D // 2, d + D // 2, d - D // 2)  # rotate-half's partner of each dim
        # Everything the first key tile needs but its keys is loaded first, in one round trip to memory with the new
        # keys' loads below: the queries (normalised and rotated), their positions, the tile's cache block ids.
        token = row * Q + m // G
        head = kv_head * G + m % G
        q_pos = tl.load(positions_ptr + token, mask=m_ok, other=0)
        i = tl.arange(0, BLOCK_Q)  # the row's tokens
        i_ok = i < Q
        new_token = row * Q + i
        new_pos = tl.load(positions_ptr + new_token, mask=i_ok, other=0)
        if ROPE:  # the row's Q tokens' tables, computed once; each query row takes its token's
            cos, sin = _rope_table_rows(new_pos, d, inv_freq_ptr, D, q_ptr.dtype.element_ty)
            pick = tl.minimum(m // G, BLOCK_Q - 1)[:, None] + 0 * d[None, :]
            q_cos, q_sin = tl.gather(cos, pick, 0), tl.gather(sin, pick, 0)
        else:
            cos, sin, q_cos, q_sin = 0.0, 0.0, 0.0, 0.0
        q = _head_prologue(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh, q_cos, q_sin,
                           m_ok[:, None] & d_ok[None, :], d, d_swapped, q_norm_ptr, eps, D, QK_NORM, ROPE,
                           ROUND_HALF)
        n_idx = tl.arange(0, BLOCK_N)
        block = _tile_blocks(block_table_ptr + row * stride_bt, key_start + n_idx, num_keys, BLOCK_SIZE)
        if WRITE_KV:
            # This step's keys/values of the row's Q tokens for this KV head go to their slots first (a slot
            # addresses block * BLOCK_SIZE + offset of the contiguous cache); then a barrier makes them
            # visible to the whole program, which reads them back in its tiles. Split: each token is written by
            # the program whose keys hold its position (the last one: any past them), the one that reads it.
            if SPLIT:
                i_ok = i_ok & (((new_pos >= key_start) & (new_pos < key_stop)) | ((split == 0) & (new_pos < 0))
                               | ((split == active - 1) & (new_pos >= key_stop)))
            slot = tl.load(write_index_ptr + new_token, mask=i_ok, other=0)
            slot = tl.where(slot < 0, BLOCK_SIZE - 1, slot)  # padding (-1): the NULL block's scratch slot
            new_mask = i_ok[:, None] & d_ok[None, :]
            new_k = _head_prologue(new_k_ptr + new_token[:, None] * stride_nkt + kv_head * stride_nkh, cos, sin,
                                   new_mask, d, d_swapped, k_norm_ptr, eps, D, QK_NORM, ROPE, ROUND_HALF)
            new_v = tl.load(new_v_ptr + new_token[:, None] * stride_nvt + kv_head * stride_nvh + d[None, :],
                            mask=new_mask, other=0.0)
            dst = kv_ptr + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
            tl.store(dst, new_k.to(kv_ptr.dtype.element_ty), mask=new_mask)
            tl.store(dst + stride_kv, new_v.to(kv_ptr.dtype.element_ty), mask=new_mask)
            tl.debug_barrier()
        running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        if AHEAD:  # the first tile's keys and values, after the step's keys are written (it may hold them)
            k_next, v_next = _tile_kv(kv_ptr, block, key_start + n_idx, (key_start + n_idx) < num_keys, kv_head, d,
                                      d_ok, stride_kv, stride_kb, stride_ks, stride_kh, BLOCK_SIZE)
            block = _tile_blocks(block_table_ptr + row * stride_bt, key_start + BLOCK_N + n_idx, num_keys,
                                 BLOCK_SIZE)
        for n0 in range(key_start, key_stop, BLOCK_N):
            # BLOCK_N keys, each read where its cache block puts it (a tile may span several blocks). AHEAD: they were
            # loaded in the tile before, which loads the next tile's (none past key_stop) and the block ids of the
            # one after, so the next tile's round trip to memory overlaps this tile's compute; else they are loaded
            # here with the next tile's block ids
            key_pos = n0 + n_idx
            if AHEAD:
                k, v = k_next, v_next
                ahead = key_pos + BLOCK_N
                k_next, v_next = _tile_kv(kv_ptr, block, ahead, (ahead < num_keys) & (n0 + BLOCK_N < key_stop),
                                          kv_head, d, d_ok, stride_kv, stride_kb, stride_ks, stride_kh, BLOCK_SIZE)
                block = _tile_blocks(block_table_ptr + row * stride_bt, ahead + BLOCK_N, num_keys, BLOCK_SIZE)
            else:
                k, v = _tile_kv(kv_ptr, block, key_pos, key_pos < num_keys, kv_head, d, d_ok, stride_kv, stride_kb,
                                stride_ks, stride_kh, BLOCK_SIZE)
                block = _tile_blocks(block_table_ptr + row * stride_bt, key_pos + BLOCK_N, num_keys, BLOCK_SIZE)
            if IEEE:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            scores = scores * scale
            visible = ((key_pos[None, :] <= q_pos[:, None]) & (key_pos[None, :] < seq_len)) | (key_pos[None, :] == 0)
            scores = tl.where(visible, scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            # every row sees key 0 in the first tile, so new_max is finite from the first tile on; a split's
            # tiles may hold no key a row sees (its max stays -inf: it adds nothing)
            if SPLIT:
                new_max_finite = tl.where(new_max == float("-inf"), 0.0, new_max)
            else:
                new_max_finite = new_max
            correction = tl.exp(running_max - new_max_finite)
            p = tl.exp(scores - new_max_finite[:, None])
            running_sum = running_sum * correction + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * correction[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v)
            running_max = new_max
        out_mask = m_ok[:, None] & d_ok[None, :]
        out_ptrs = out_ptr + token[:, None] * stride_ot + head[:, None] * D + d[None, :]
        if SPLIT:
            if active == 1:
                tl.store(out_ptrs, (acc / running_sum[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
            else:
                _combine_splits(acc, running_max, running_sum, out_ptrs, out_mask, part_ptr, ml_ptr, counter_ptr,
                                row * tl.num_programs(1) + kv_head, split, active, tl.num_programs(2), m, d,
                                BLOCK_M, BLOCK_D)
        else:
            tl.store(out_ptrs, (acc / running_sum[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _tile_kv(kv_ptr, block, key_pos, key_ok, kv_head, d, d_ok, stride_kv, stride_kb, stride_ks, stride_kh,
                 BLOCK_SIZE: tl.constexpr):
        """(keys, values) [BLOCK_N, BLOCK_D] of one KV head at positions key_pos [BLOCK_N] of a row, in cache blocks
        `block` [BLOCK_N] (`_tile_blocks`); 0 where key_ok is False or d_ok is."""
        offsets = (block.to(tl.int64)[:, None] * stride_kb + (key_pos % BLOCK_SIZE)[:, None] * stride_ks
                   + kv_head * stride_kh + d[None, :])
        mask = key_ok[:, None] & d_ok[None, :]
        return (tl.load(kv_ptr + offsets, mask=mask, other=0.0),
                tl.load(kv_ptr + stride_kv + offsets, mask=mask, other=0.0))

    @triton.jit
    def _tile_blocks(row_table_ptr, key_pos, num_keys, BLOCK_SIZE: tl.constexpr):
        """int32[BLOCK_N]: the cache block of each key position of a tile, from a row's block table (0 for positions
        at or past num_keys, the table's static bound)."""
        return tl.load(row_table_ptr + key_pos // BLOCK_SIZE, mask=key_pos < num_keys, other=0)

    @triton.jit
    def _combine_splits(acc, running_max, running_sum, out_ptrs, out_mask, part_ptr, ml_ptr, counter_ptr, pair,
                        split, active, num_splits, m, d, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        """A split program's partial softmax (acc [BLOCK_M, BLOCK_D], max and sum [BLOCK_M], fp32) to the scratch of
        its (row, KV head) `pair`; the last of the `active` programs to arrive (a count at counter_ptr[pair])
        merges them in split order, stores the output and zeroes the count for the next launch.
        part_ptr: fp32[pairs, num_splits, BLOCK_M, BLOCK_D]; ml_ptr: fp32[pairs, num_splits, 2, BLOCK_M]."""
        slot = pair * num_splits + split
        tl.store(part_ptr + slot * BLOCK_M * BLOCK_D + m[:, None] * BLOCK_D + d[None, :], acc)
        tl.store(ml_ptr + slot * 2 * BLOCK_M + m, running_max)
        tl.store(ml_ptr + slot * 2 * BLOCK_M + BLOCK_M + m, running_sum)
        if arrive_last(counter_ptr + pair, active):
            total_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            total_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
            total = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
            for s in range(active):
                base = pair * num_splits + s
                part_max = tl.load(ml_ptr + base * 2 * BLOCK_M + m, cache_modifier=".cg")
                part_sum = tl.load(ml_ptr + base * 2 * BLOCK_M + BLOCK_M + m, cache_modifier=".cg")
                part = tl.load(part_ptr + base * BLOCK_M * BLOCK_D + m[:, None] * BLOCK_D + d[None, :],
                               cache_modifier=".cg")
                new_max = tl.maximum(total_max, part_max)  # split 0 holds key 0: finite from s = 0 on
                old_scale = tl.exp(total_max - new_max)
                part_scale = tl.exp(part_max - new_max)
                total_sum = total_sum * old_scale + part_sum * part_scale
                total = total * old_scale[:, None] + part * part_scale[:, None]
                total_max = new_max
            tl.store(out_ptrs, (total / total_sum[:, None]).to(out_ptrs.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _head_prologue(row_ptr, cos, sin, mask, d, d_swapped, norm_ptr, eps,
                       D: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr, ROUND_HALF: tl.constexpr):
        """Heads [rows, BLOCK_D] (row i's dims at row_ptr[i] + d) as attention reads them: per-head RMSNorm
        (NORM: weight at norm_ptr), then rotate-half RoPE (ROPE): x * cos + partner * signed_sin, the rows' tables
        (cos, sin) fp32 [rows, BLOCK_D] from :func:`_rope_table_rows`. Eager's arithmetic and, in half precision,
        its roundings after each op. In x's dtype."""
        x = tl.load(row_ptr + d[None, :], mask=mask, other=0.0)
        dtype = x.dtype
        x = x.to(tl.float32)
        if ROPE:
            partner = tl.load(row_ptr + d_swapped[None, :], mask=mask, other=0.0).to(tl.float32)
        if NORM:
            inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
            x = _norm_scale(x, inv_rms, norm_ptr, d, D, dtype, ROUND_HALF)
            if ROPE:
                partner = _norm_scale(partner, inv_rms, norm_ptr, d_swapped, D, dtype, ROUND_HALF)
        if ROPE:
            x = x * cos
            partner = partner * sin
            if ROUND_HALF:
                x = x.to(dtype).to(tl.float32)
                partner = partner.to(dtype).to(tl.float32)
            x = x + partner
        return x.to(dtype)

    @triton.jit
    def _rope_table_rows(pos, d, inv_freq_ptr, D: tl.constexpr, dtype):
        """fp32 (cos, signed_sin) [rows, BLOCK_D] of positions pos [rows]: `pointwise.rope_tables`' values, op for op
        (f = float(pos) * inv_freq in fp32, cos of [f, f] and sin of [-f, f], each rounded to dtype; the same
        cos/sin as the compiled tables' generated kernel)."""
        half = tl.where(d < D // 2, d, d - D // 2)
        inv_freq = tl.load(inv_freq_ptr + half, mask=d < D, other=0.0)
        f = pos.to(tl.float32)[:, None] * inv_freq[None, :]
        cos = tl.cos(f).to(dtype).to(tl.float32)
        sin = tl.sin(tl.where(d[None, :] < D // 2, -f, f)).to(dtype).to(tl.float32)
        return cos, sin

    @triton.jit
    def _norm_scale(x, inv_rms, norm_ptr, dims, D: tl.constexpr, dtype, ROUND_HALF: tl.constexpr):
        """x [rows, BLOCK_D] (fp32) * inv_rms [rows] * weight[dims]: `pointwise.rms_norm`'s arithmetic (half
        precision: the normalised x rounded to dtype, then the product)."""
        x = x * inv_rms[:, None]
        if ROUND_HALF:
            x = x.to(dtype).to(tl.float32)
        x = x * tl.load(norm_ptr + dims, mask=dims < D, other=0.0).to(tl.float32)[None, :]
        if ROUND_HALF:
            x = x.to(dtype).to(tl.float32)
        return x


def supports(query: torch.Tensor, kv_cache: torch.Tensor, queries_per_row: int, *new_kv: torch.Tensor,
             rope_inv_freq: torch.Tensor | None = None,
             qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> bool:
    """Whether :func:`paged_attention_uniform` takes this batch: triton present, one dtype, contiguous head
    dims (of the query and of `new_kv`, this step's keys and values if the kernel writes them) and cache, at
    most MAX_QUERY_ROWS query rows per program, `rope_inv_freq` (if given) fp32[D/2] contiguous with an even head
    dim, and `qk_norm` weights (if given) of the query's dtype, contiguous."""
    group = query.shape[1] // kv_cache.shape[3]
    rope_ok = rope_inv_freq is None or (query.shape[2] % 2 == 0 and rope_inv_freq.dtype == torch.float32
                                        and rope_inv_freq.is_contiguous()
                                        and rope_inv_freq.shape == (query.shape[2] // 2,))
    norm_ok = qk_norm is None or all(t.dtype == query.dtype and t.is_contiguous() for t in qk_norm[:2])
    return (AVAILABLE and query.dtype == kv_cache.dtype and query.stride(2) == 1 and kv_cache.is_contiguous()
            and all(t.dtype == query.dtype and t.stride(2) == 1 for t in new_kv)
            and group * queries_per_row <= MAX_QUERY_ROWS and rope_ok and norm_ok)


def token_rows(queries_per_row: int, block_d: int, rope: bool, num_warps: int) -> int:
    """BLOCK_Q, the rows of a program's tile of its row's tokens (their new keys and values, their RoPE tables): the
    queries per row rounded up to a power of 2, at least 2; with in-kernel RoPE at least 32 * num_warps / block_d
    too, as Triton's gather of each query head's table row from a tile of fewer elements than the program's
    threads fails to compile for sm_90 (triton 3.6)."""
    rows = max(2, triton.next_power_of_2(queries_per_row))
    return max(rows, 32 * num_warps // block_d) if rope else rows


def paged_attention_uniform(query: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                            block_table: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int,
                            scale: float, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                            write_index: torch.Tensor | None = None,
                            rope_inv_freq: torch.Tensor | None = None,
                            qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
                            pdl: bool = False,
                            split_counters: Callable[[int], torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention of a uniform batch over its rows' cached keys; with `key`/`value`/`write_index` it first
    writes this step's keys and values into the cache (in the same kernel), else they must be there already.
    With `rope_inv_freq` (fp32[D/2], `layers.RotaryEmbedding`'s), the query and the new keys are given before RoPE
    and rotated in the kernel at their `positions`, the tables' values computed there (`pointwise.rope_tables`'
    and `pointwise.apply_rope`'s arithmetic and roundings). With `qk_norm` = (q_weight [D], k_weight [D], eps) they
    are first normalised per head (`pointwise.rms_norm`'s arithmetic, Qwen3's and LFM2's q/k norms). Both need
    the new keys (the cached ones are already normalised and rotated).

    query [R * Q, Hq, D] (row r's queries at tokens r*Q .. r*Q+Q-1; head dim contiguous); positions int64[R*Q];
    kv_cache [2, num_blocks_total, block_size, Hkv, D] (contiguous); block_table int32[R, >= num_blocks];
    seq_lens int32[R]; num_blocks: cache blocks each row walks (a static bound: keys past seq_len are masked;
    any block size).
    key/value: [R * Q, Hkv, D] (head dim contiguous); write_index: int64[R * Q] flat cache slot of each token,
    -1 for padding, which the kernel writes to the NULL block's scratch slot (`attention.padding_slot`), as
    `attention.write_kv_cache` does.
    pdl (`engine.programmatic_launch`): on an sm_90+ GPU, launched with programmatic dependent launch (it waits
    for the kernels before it first thing; `triton_support.early_launch_flags`).
    split_counters: called with R * Hkv when the launch splits its keys over programs (`num_key_splits` > 1), it
    gives that many int32 zeros; the kernel leaves them zero, so one buffer serves a forward's layers (None: zeroed
    here, a buffer a launch).
    Returns [R * Q, Hq * D] in query's dtype.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_rows = block_table.shape[0]
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    q_per_row = num_tokens // num_rows
    out = torch.empty(num_tokens, num_heads * head_dim, device=query.device, dtype=query.dtype)
    write = key is not None
    rope = rope_inv_freq is not None
    if (rope or qk_norm is not None) and not write:
        raise ValueError("in-kernel RoPE / q-k norms need this step's keys (key/value/write_index): cached keys "
                         "are already rotated and normalised")
    new_k, new_v, index = (key, value, write_index) if write else (query, query, positions)
    inv_freq = rope_inv_freq if rope else query
    q_norm, k_norm, eps = qk_norm if qk_norm is not None else (query, query, 0.0)
    num_keys = num_blocks * block_size
    block_m = max(16, triton.next_power_of_2(group * q_per_row))
    block_d = max(16, triton.next_power_of_2(head_dim))
    splits = num_key_splits(num_keys, num_rows, num_kv_heads)
    pairs = num_rows * num_kv_heads
    if splits > 1:  # each split's partial softmax, and per (row, KV head) a count of the splits done
        part = torch.empty(pairs * splits * block_m * block_d, device=query.device, dtype=torch.float32)
        max_sum = torch.empty(pairs * splits * 2 * block_m, device=query.device, dtype=torch.float32)
        counters = (split_counters(pairs) if split_counters is not None
                    else torch.zeros(pairs, device=query.device, dtype=torch.int32))
    else:
        part = max_sum = counters = out  # not read
    _paged_attention_kernel[(num_rows, num_kv_heads, splits)](
        query, kv_cache, block_table, seq_lens, positions, out, new_k, new_v, index, inv_freq, q_norm, k_norm,
        query.stride(0), query.stride(1), kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        kv_cache.stride(3), block_table.stride(0), out.stride(0),
        new_k.stride(0), new_k.stride(1), new_v.stride(0), new_v.stride(1),
        scale, num_keys, eps, part, max_sum, counters,
        Q=q_per_row, G=group, D=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=KEYS_PER_TILE, BLOCK_D=block_d,
        BLOCK_Q=token_rows(q_per_row, block_d, rope, NUM_WARPS),
        WRITE_KV=write, QK_NORM=qk_norm is not None, ROPE=rope,
        ROUND_HALF=query.dtype in (torch.float16, torch.bfloat16), IEEE=query.dtype == torch.float32,
        SPLIT=splits > 1, AHEAD=LOAD_AHEAD, num_warps=NUM_WARPS, **early_launch_flags(pdl, query.device),
        **({} if NUM_STAGES is None else {"num_stages": NUM_STAGES}),
    )
    return out
