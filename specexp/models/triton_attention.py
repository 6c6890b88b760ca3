"""Paged attention for uniform batches (decode and verify steps) in one Triton kernel.

The default path (`specexp.models.attention.paged_attention`) gathers each row's keys and values out of the
paged cache into a dense tensor and runs SDPA on it: two kernels and a copy of every key per layer. Here one
program per (row, KV head) walks the row's block table, reads each cache block where it lies and keeps an
online softmax (flash-decoding without the split): at batch 1 that is one small kernel per layer instead of
a gather plus an SDPA launch.

It also writes the step's keys and values into the cache (the engine's path: one kernel per layer for the KV
write and the attention). Covers batches whose rows all hold the same number of queries Q (row r's queries at tokens r*Q .. r*Q+Q-1),
which is every decode and verify step and every graph replay; the G query heads sharing a KV head and the Q
queries of a row form the program's G*Q query rows. Masking is the default path's: key j is visible to a
query at position p when j <= p and j < seq_len, and key 0 always is (padded rows stay finite). A program
walks only its row's tiles below seq_len: a captured graph's key bound (its seq-len bucket) costs nothing
past the row's actual context.

Importable without Triton (`AVAILABLE` False); the kernel needs a CUDA device or Triton's interpreter.
"""

from __future__ import annotations

import torch

from specexp.models.triton_support import AVAILABLE, early_launch_flags, tl, triton, wait_for_earlier_kernels

MAX_QUERY_ROWS = 128  # G * Q per program: beyond this the default path is used
KEYS_PER_TILE = 64  # keys per online-softmax step (a multiple of 16 for tl.dot)


if AVAILABLE:

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, kv_ptr, block_table_ptr, seq_lens_ptr, positions_ptr, out_ptr,
        new_k_ptr, new_v_ptr, write_index_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr,
        stride_qt, stride_qh, stride_kv, stride_kb, stride_ks, stride_kh, stride_bt, stride_ot,
        stride_nkt, stride_nkh, stride_nvt, stride_nvh, stride_rt,
        scale, num_keys, eps,
        Q: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
        WRITE_KV: tl.constexpr, QK_NORM: tl.constexpr, ROPE: tl.constexpr, ROUND_HALF: tl.constexpr,
        IEEE: tl.constexpr, GDC: tl.constexpr = False,
    ):
        wait_for_earlier_kernels(GDC)  # launched early: every input may come from the kernel before
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        m = tl.arange(0, BLOCK_M)  # query rows of this program: m = i * G + g
        d = tl.arange(0, BLOCK_D)
        m_ok = m < Q * G
        d_ok = d < D
        d_swapped = tl.where(d < D // 2, d + D // 2, d - D // 2)  # rotate-half's partner of each dim
        if WRITE_KV:
            # This step's keys/values of the row's Q tokens for this KV head go to their slots first (a slot
            # addresses block * BLOCK_SIZE + offset of the contiguous cache); then a barrier makes them
            # visible to the whole program, which reads them back in its tiles.
            i = tl.arange(0, BLOCK_Q)
            i_ok = i < Q
            new_token = row * Q + i
            slot = tl.load(write_index_ptr + new_token, mask=i_ok, other=0)
            slot = tl.where(slot < 0, BLOCK_SIZE - 1, slot)  # padding (-1): the NULL block's scratch slot
            new_mask = i_ok[:, None] & d_ok[None, :]
            new_k = _head_prologue(new_k_ptr + new_token[:, None] * stride_nkt + kv_head * stride_nkh, new_token,
                                   new_mask, d, d_swapped, k_norm_ptr, cos_ptr, sin_ptr, stride_rt, eps,
                                   D, QK_NORM, ROPE, ROUND_HALF)
            new_v = tl.load(new_v_ptr + new_token[:, None] * stride_nvt + kv_head * stride_nvh + d[None, :],
                            mask=new_mask, other=0.0)
            dst = kv_ptr + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
            tl.store(dst, new_k.to(kv_ptr.dtype.element_ty), mask=new_mask)
            tl.store(dst + stride_kv, new_v.to(kv_ptr.dtype.element_ty), mask=new_mask)
            tl.debug_barrier()
        token = row * Q + m // G
        head = kv_head * G + m % G
        q = _head_prologue(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh, token,
                           m_ok[:, None] & d_ok[None, :], d, d_swapped, q_norm_ptr, cos_ptr, sin_ptr, stride_rt, eps,
                           D, QK_NORM, ROPE, ROUND_HALF)
        q_pos = tl.load(positions_ptr + token, mask=m_ok, other=0)
        seq_len = tl.load(seq_lens_ptr + row)
        n_idx = tl.arange(0, BLOCK_N)
        running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # keys at or past seq_len are masked: walk only the tiles below it (at least one: key 0 is always seen)
        for n0 in range(0, tl.maximum(tl.minimum(num_keys, seq_len), 1), BLOCK_N):
            # BLOCK_N keys, each read where its cache block puts it (a tile may span several blocks)
            key_pos = n0 + n_idx
            key_ok = key_pos < num_keys
            block = tl.load(block_table_ptr + row * stride_bt + key_pos // BLOCK_SIZE, mask=key_ok, other=0)
            kv_offsets = (block.to(tl.int64)[:, None] * stride_kb + (key_pos % BLOCK_SIZE)[:, None] * stride_ks
                          + kv_head * stride_kh + d[None, :])
            kv_mask = key_ok[:, None] & d_ok[None, :]
            k = tl.load(kv_ptr + kv_offsets, mask=kv_mask, other=0.0)
            v = tl.load(kv_ptr + stride_kv + kv_offsets, mask=kv_mask, other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            scores = scores * scale
            visible = ((key_pos[None, :] <= q_pos[:, None]) & (key_pos[None, :] < seq_len)) | (key_pos[None, :] == 0)
            scores = tl.where(visible, scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            # every row sees key 0 in the first tile, so new_max is finite from the first tile on
            correction = tl.exp(running_max - new_max)
            p = tl.exp(scores - new_max[:, None])
            running_sum = running_sum * correction + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * correction[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v)
            running_max = new_max
        out = acc / running_sum[:, None]
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * D + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])

    @triton.jit
    def _head_prologue(row_ptr, token, mask, d, d_swapped, norm_ptr, cos_ptr, sin_ptr, stride_rt, eps,
                       D: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr, ROUND_HALF: tl.constexpr):
        """Heads [rows, BLOCK_D] (row i's dims at row_ptr[i] + d) as attention reads them: per-head RMSNorm
        (NORM: weight at norm_ptr), then rotate-half RoPE at their tokens' angles (ROPE): x * cos + partner *
        signed_sin. Eager's arithmetic and, in half precision, its roundings after each op. In x's dtype."""
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
            cos = tl.load(cos_ptr + token[:, None] * stride_rt + d[None, :], mask=mask, other=0.0).to(tl.float32)
            sin = tl.load(sin_ptr + token[:, None] * stride_rt + d[None, :], mask=mask, other=0.0).to(tl.float32)
            x = x * cos
            partner = partner * sin
            if ROUND_HALF:
                x = x.to(dtype).to(tl.float32)
                partner = partner.to(dtype).to(tl.float32)
            x = x + partner
        return x.to(dtype)

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
             rope: tuple[torch.Tensor, torch.Tensor] | None = None,
             qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> bool:
    """Whether :func:`paged_attention_uniform` takes this batch: triton present, one dtype, contiguous head
    dims (of the query and of `new_kv`, this step's keys and values if the kernel writes them) and cache, at
    most MAX_QUERY_ROWS query rows per program, `rope` tables (if given) with contiguous rows of the query's
    dtype and an even head dim, and `qk_norm` weights (if given) of the query's dtype, contiguous."""
    group = query.shape[1] // kv_cache.shape[3]
    rope_ok = rope is None or (query.shape[2] % 2 == 0 and all(
        t.dtype == query.dtype and t.stride(1) == 1 and t.stride(0) == rope[0].stride(0) for t in rope))
    norm_ok = qk_norm is None or all(t.dtype == query.dtype and t.is_contiguous() for t in qk_norm[:2])
    return (AVAILABLE and query.dtype == kv_cache.dtype and query.stride(2) == 1 and kv_cache.is_contiguous()
            and all(t.dtype == query.dtype and t.stride(2) == 1 for t in new_kv)
            and group * queries_per_row <= MAX_QUERY_ROWS and rope_ok and norm_ok)


def paged_attention_uniform(query: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                            block_table: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int,
                            scale: float, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                            write_index: torch.Tensor | None = None,
                            rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                            qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
                            pdl: bool = False) -> torch.Tensor:
    """Causal attention of a uniform batch over its rows' cached keys; with `key`/`value`/`write_index` it first
    writes this step's keys and values into the cache (in the same kernel), else they must be there already.
    With `rope` = (cos, signed_sin), each [R * Q, D] contiguous (`layers.RotaryEmbedding`'s tables), the query
    and the new keys are given before RoPE and rotated in the kernel (`pointwise.apply_rope`'s arithmetic and
    roundings). With `qk_norm` = (q_weight [D], k_weight [D], eps) they are first normalised per head
    (`pointwise.rms_norm`'s arithmetic, Qwen3's and LFM2's q/k norms). Both need the new keys (the cached ones
    are already normalised and rotated).

    query [R * Q, Hq, D] (row r's queries at tokens r*Q .. r*Q+Q-1; head dim contiguous); positions int64[R*Q];
    kv_cache [2, num_blocks_total, block_size, Hkv, D] (contiguous); block_table int32[R, >= num_blocks];
    seq_lens int32[R]; num_blocks: cache blocks each row walks (a static bound: keys past seq_len are masked;
    any block size).
    key/value: [R * Q, Hkv, D] (head dim contiguous); write_index: int64[R * Q] flat cache slot of each token,
    -1 for padding, which the kernel writes to the NULL block's scratch slot (`attention.padding_slot`), as
    `attention.write_kv_cache` does.
    pdl (`engine.programmatic_launch`): on an sm_90+ GPU, launched with programmatic dependent launch (it waits
    for the kernels before it first thing; `triton_support.early_launch_flags`).
    Returns [R * Q, Hq * D] in query's dtype.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_rows = block_table.shape[0]
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    q_per_row = num_tokens // num_rows
    out = torch.empty(num_tokens, num_heads * head_dim, device=query.device, dtype=query.dtype)
    write = key is not None
    if (rope is not None or qk_norm is not None) and not write:
        raise ValueError("in-kernel RoPE / q-k norms need this step's keys (key/value/write_index): cached keys "
                         "are already rotated and normalised")
    new_k, new_v, index = (key, value, write_index) if write else (query, query, positions)
    cos, sin = rope if rope is not None else (query, query)
    q_norm, k_norm, eps = qk_norm if qk_norm is not None else (query, query, 0.0)
    _paged_attention_kernel[(num_rows, num_kv_heads)](
        query, kv_cache, block_table, seq_lens, positions, out, new_k, new_v, index, cos, sin, q_norm, k_norm,
        query.stride(0), query.stride(1), kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        kv_cache.stride(3), block_table.stride(0), out.stride(0),
        new_k.stride(0), new_k.stride(1), new_v.stride(0), new_v.stride(1), cos.stride(0),
        scale, num_blocks * block_size, eps,
        Q=q_per_row, G=group, D=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=max(16, triton.next_power_of_2(group * q_per_row)), BLOCK_N=KEYS_PER_TILE,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_Q=max(2, triton.next_power_of_2(q_per_row)),
        WRITE_KV=write, QK_NORM=qk_norm is not None, ROPE=rope is not None, ROUND_HALF=query.dtype in (torch.float16, torch.bfloat16),
        IEEE=query.dtype == torch.float32, num_warps=4, **early_launch_flags(pdl, query.device),
    )
    return out
