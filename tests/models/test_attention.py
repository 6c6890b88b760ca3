"""The paged attention op against a naive per-request attention, plus its padding and static-shape rules."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specexp.models import attention
from specexp.models.attention import attend, is_uniform, padding_slot, paged_attention, write_kv_cache
from specexp.models.metadata import AttentionMetadata


def naive_attention(q, k, v, scale):
    """q [n, Hq, D] at the last n positions of k/v [S, Hkv, D]: causal, GQA by repeat."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    n, s = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    causal = torch.arange(s).view(1, -1) <= (torch.arange(n) + s - n).view(-1, 1)
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)


def build_batch(query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size=4, num_blocks=40,
                pad_rows=0, pad_tokens=0, seed=0, max_query_len=None, max_blocks=12):
    """Random paged cache + metadata for rows with given (new queries, cached context) lengths."""
    gen = torch.Generator().manual_seed(seed)
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0 = NULL
    rows, qsl, slots, token_rows, positions, seq_lens, tables = [], [0], [], [], [], [], []
    for r, (nq, nc) in enumerate(zip(query_lens, context_lens)):
        total = nq + nc
        blocks = [perm.pop() for _ in range(math.ceil(total / block_size))]
        tables.append(blocks + [0] * (max_blocks - len(blocks)))
        seq_lens.append(total)
        qsl.append(qsl[-1] + nq)
        for p in range(nc, total):
            slots.append(blocks[p // block_size] * block_size + p % block_size)
            positions.append(p)
            token_rows.append(r)
        rows.append(blocks)
    num_real = qsl[-1]
    qsl += [num_real] * pad_rows
    seq_lens += [0] * pad_rows
    tables += [[0] * max_blocks] * pad_rows
    slots += [-1] * pad_tokens
    positions += [0] * pad_tokens
    token_rows += [0] * pad_tokens
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        token_req_indices=torch.tensor(token_rows, dtype=torch.int64),
        max_seq_len=max_blocks * block_size,
        max_query_len=max(query_lens) + 2 if max_query_len is None else max_query_len,
        num_actual_tokens=num_real,
    )
    num_tokens = num_real + pad_tokens
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    return kv_cache, meta, q, k, v, torch.tensor(positions), rows


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_paged_attention_equals_naive_attention_per_request(num_heads, num_kv_heads):
    query_lens, context_lens = [1, 1, 5, 9], [7, 0, 3, 14]
    kv_cache, meta, q, k, v, positions, rows = build_batch(query_lens, context_lens, num_heads, num_kv_heads, 8,
                                                           pad_rows=2, pad_tokens=3)
    out = attend(q, k, v, positions, kv_cache, meta, scale=8**-0.5)
    assert out.shape == (q.shape[0], num_heads * 8)
    assert torch.isfinite(out).all()
    start = 0
    for blocks, nq, nc in zip(rows, query_lens, context_lens):
        dense = kv_cache[:, blocks].reshape(2, -1, num_kv_heads, 8)[:, : nq + nc]
        expected = naive_attention(q[start:start + nq], dense[0], dense[1], 8**-0.5)
        torch.testing.assert_close(out[start:start + nq], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(dense[0, nc:], k[start:start + nq])  # this step's keys were written
        start += nq


def test_slot_minus_one_writes_only_the_null_blocks_scratch_slot():
    kv_cache = torch.randn(2, 4, 2, 1, 3)  # 4 blocks of 2 slots; block 0 is NULL, its slot 1 the scratch
    before = kv_cache.clone()
    key, value = torch.ones(3, 1, 3), 2 * torch.ones(3, 1, 3)
    write_kv_cache(kv_cache, key, value, torch.tensor([5, -1, -1]))
    flat, flat_before = kv_cache.view(2, 8, 1, 3), before.view(2, 8, 1, 3)
    assert (flat[0, 5] == 1).all() and (flat[1, 5] == 2).all()
    assert padding_slot(2) == 1 and (flat[0, 1] == 1).all()  # padding landed in the scratch slot
    others = [i for i in range(8) if i not in (1, 5)]
    assert torch.equal(flat[:, others], flat_before[:, others])  # key 0 of the NULL block untouched


def test_padding_writes_never_reach_a_real_rows_output():
    """Padded tokens write into the NULL block; real rows read NULL blocks only past their seq_len (masked),
    so their outputs equal those of the same batch without any padding."""
    kv_cache, meta, q, k, v, positions, _ = build_batch([3, 1], [2, 5], 4, 2, 8, pad_rows=2, pad_tokens=3)
    kv_clean, meta_clean, *_ = build_batch([3, 1], [2, 5], 4, 2, 8)
    real = meta.num_actual_tokens
    padded = attend(q, k * 1e3, v * 1e3, positions, kv_cache, meta, scale=0.3)  # loud padding K/V
    clean = attend(q[:real], k[:real] * 1e3, v[:real] * 1e3, positions[:real], kv_clean, meta_clean, scale=0.3)
    torch.testing.assert_close(padded[:real], clean)


def test_padded_rows_stay_finite_over_nonfinite_null_block():
    """A padded row reads the NULL block; even garbage there must not leak NaN into real rows."""
    kv_cache, meta, q, k, v, positions, _ = build_batch([3, 1], [2, 5], 4, 2, 8, pad_rows=2, pad_tokens=2)
    reference = attend(q, k, v, positions, kv_cache.clone(), meta, scale=0.3)
    kv_cache[:, 0] = 1e4  # huge but finite junk in the NULL block
    out = attend(q, k, v, positions, kv_cache, meta, scale=0.3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[: meta.num_actual_tokens], reference[: meta.num_actual_tokens])


def test_op_has_static_shapes_and_no_host_reads():
    """On the meta device any `.item()` or data-dependent shape raises: the op is graph-capturable."""
    kv_cache, meta, q, k, v, positions, _ = build_batch([2, 4], [3, 0], 4, 2, 8, pad_rows=1, pad_tokens=2)
    to_meta = lambda t: torch.empty_like(t, device="meta")
    meta_md = AttentionMetadata(
        **{name: to_meta(value) if isinstance(value, torch.Tensor) else value for name, value in vars(meta).items()}
    )
    out = attend(to_meta(q), to_meta(k), to_meta(v), to_meta(positions), to_meta(kv_cache), meta_md, scale=0.3)
    assert out.shape == (q.shape[0], 32) and out.device.type == "meta"
    assert paged_attention(to_meta(q), to_meta(positions), to_meta(kv_cache), meta_md, 0.3).shape == out.shape


@pytest.mark.parametrize("queries_per_row,pad_rows", [(1, 0), (1, 3), (4, 0), (4, 2)])
def test_uniform_batches_skip_the_query_gather_and_agree_with_it(monkeypatch, queries_per_row, pad_rows):
    """Every row Q queries (a decode or verify batch, graph-padded with whole rows of Q tokens): the op reads
    queries in place instead of gathering them, with the same result as the gathering path and the naive one."""
    query_lens, context_lens = [queries_per_row] * 3, [5, 0, 17]
    kv_cache, meta, q, k, v, positions, rows = build_batch(
        query_lens, context_lens, 4, 2, 8, pad_rows=pad_rows, pad_tokens=pad_rows * queries_per_row,
        max_query_len=queries_per_row)
    assert is_uniform(meta, q.shape[0])
    out = attend(q, k, v, positions, kv_cache.clone(), meta, scale=0.3)
    monkeypatch.setattr(attention, "is_uniform", lambda meta, num_tokens: False)
    gathered = attend(q, k, v, positions, kv_cache.clone(), meta, scale=0.3)
    real = meta.num_actual_tokens
    torch.testing.assert_close(out[:real], gathered[:real], rtol=0, atol=0)
    assert torch.isfinite(out).all()
    start = 0
    written = kv_cache.clone()
    write_kv_cache(written, k, v, meta.slot_mapping)
    for blocks, nq, nc in zip(rows, query_lens, context_lens):
        dense = written[:, blocks].reshape(2, -1, 2, 8)[:, : nq + nc]
        torch.testing.assert_close(out[start:start + nq], naive_attention(q[start:start + nq], dense[0], dense[1], 0.3),
                                   atol=1e-5, rtol=1e-5)
        start += nq


def test_ragged_batches_are_not_uniform():
    _, meta, q, *_ = build_batch([4, 2, 4], [1, 1, 1], 4, 2, 8, max_query_len=4)
    assert not is_uniform(meta, q.shape[0])
    _, meta, q, *_ = build_batch([4, 4], [1, 1], 4, 2, 8, pad_tokens=4, max_query_len=4)  # padding, no padded row
    assert not is_uniform(meta, q.shape[0])


class _CountOps(TorchDispatchMode):
    """Records the aten ops dispatched inside the block that may launch a kernel (not views, not the 0-dim
    tensor a Python scalar becomes)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] not in ("slice", "view", "select", "scalar_tensor"):
            self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_a_forwards_shared_tensors_start_with_the_slots_alone():
    """A batch the uniform-batch kernel takes reads only the tokens' slots of the plan (the kernel maps padding
    itself): building the plan runs no kernel (a graph of such a forward holds none of the plan's); the write
    indices, the mask and the gather indices are made when the SDPA path first asks, once per forward, and equal
    their definition."""
    kv_cache, meta, q, *_ , positions, _ = build_batch([1, 1, 1], [5, 0, 17], 4, 2, 8, pad_rows=1, pad_tokens=1,
                                                      max_query_len=1)
    plan = attention.AttentionPlan(meta, positions)
    with _CountOps() as counter:
        shared = plan.tensors(q.shape[0], kv_cache.shape[2], 2, q.device)
    assert counter.ops == [], counter.ops  # the slot ids are int64 already: a view
    assert shared.slots.data_ptr() == meta.slot_mapping.data_ptr()
    assert shared.uniform and shared.num_key_blocks == -(-meta.max_seq_len // kv_cache.shape[2])
    assert shared.write_index.tolist() == [s if s >= 0 else padding_slot(kv_cache.shape[2])
                                           for s in meta.slot_mapping.tolist()]
    mask = shared.mask
    assert plan.tensors(q.shape[0], kv_cache.shape[2], 2, q.device).mask is mask  # made once per forward
    keys = torch.arange(mask.shape[-1])
    for r, (pos, seq_len) in enumerate(zip(positions.tolist(), meta.seq_lens.tolist())):
        expected = ((keys <= pos) & (keys < seq_len)) | (keys == 0)
        assert torch.equal(mask[r, 0], expected.expand(2, -1))
