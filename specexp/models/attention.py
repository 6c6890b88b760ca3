"""Paged attention over a flattened varlen batch: SDPA over gathered pages (reference op, CPU and CUDA).

How it works (one layer, R rows, T flat tokens, block size P):

1. `write_kv_cache`: token t's key/value go to flat slot `slot_mapping[t]` of the cache viewed as
   `[2, num_blocks * P, Hkv, D]`, one `index_copy_` for keys and one for values. Slot -1 (padding) is
   redirected to the NULL block's (NULL_BLOCK_ID = 0) last slot, `P - 1`: no device-to-host read is needed
   to drop padding, and no row reads that slot unmasked — real rows only reach NULL blocks past their
   seq_len (masked), padded rows read key 0 (slot 0; with P = 1 that is the same slot, and a padded row's
   output is ignored anyway). Padded tokens' keys/values are finite (token 0 at position 0), so the masked
   reads stay finite too.
2. `paged_attention`: each row gathers its first `ceil(max_seq_len / P)` blocks into dense keys/values
   `[R, S, Hkv, D]`; each row's queries are gathered into a padded `[R, max_query_len, Hq, D]` (slot i of
   row r holds token `query_start_loc[r] + i`); one batched SDPA call; every token then reads its output
   back from `(row, t - query_start_loc[row])`.

GQA without copying K/V: the G = Hq / Hkv query heads sharing a KV head are folded into the query-length
axis (`[R, Hkv, G * max_query_len, D]`), so SDPA sees plain multi-head attention with Hkv heads. This needs
no `enable_gqa` support from whichever SDPA backend runs and no repeat of the gathered K/V.

Masking: key j of row r is visible to a query at position p iff `j <= p and j < seq_lens[r]` (a boolean
mask). Key 0 is always made visible: real queries see it anyway, and padded rows (seq_len 0) or padded
query slots then attend to one finite key instead of to nothing — a fully masked softmax row is NaN on
some SDPA backends and -inf arithmetic is dtype-fragile, whereas one forced key keeps every output finite
for any dtype and never touches real rows (their own outputs come only from their own query slots).

All index tensors and the mask depend only on the step's metadata, so an `AttentionPlan` built once per
model forward computes them for the first attention layer that needs them and every later layer reuses them
(each forward builds a fresh plan, so a captured graph recomputes them from the persistent metadata at every
replay). A batch the Triton kernel takes needs only the tokens' slots: its forward builds none of them.

A uniform batch whose rows hold more queries than one program of the Triton kernel takes (a prompt chunk of Q
tokens with G * Q > `MAX_QUERY_ROWS`) is cut into sub-rows for it, after the keys are written (`_row_split`):
on an H200 the gather + SDPA path made a 64-token prompt graph of Llama-3.2-1B cost 1.9 ms, more than a
verify graph of 80 tokens (1.35 ms).

Why this op: every shape depends only on (R, T, max_query_len, max_seq_len) — CPU ints fixed at capture —
with no `.item()` and no data-dependent indexing, so a CUDA graph can capture it, and it is plain torch
that runs the same on CPU. Its cost is the dense gather (`R * S` keys per layer) and attention over the
padded `max_seq_len`. `engine.attention_kernel=triton` replaces both, for uniform batches, with one Triton
kernel that reads the paged cache in place (`specexp.models.triton_attention`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from specexp.models import triton_attention
from specexp.models.kernels import UniformKernel, set_on_modules
from specexp.models.metadata import AttentionMetadata, SegmentedPlan
from specexp.models.rope import RopeTables

# How attention layers attend (`engine.attention_kernel`): the default gather + SDPA path, or uniform batches
# on :func:`triton_attention.paged_attention_uniform` (KV write included).
SDPA = UniformKernel("sdpa", None)
TRITON = UniformKernel("triton", triton_attention.paged_attention_uniform)
ATTENTION_KERNELS = {kernel.name: kernel for kernel in (SDPA, TRITON)}

# The SDPA backends a masked CUDA call may take. cuDNN's attention is left out: it plans every new shape on the
# host (about 0.8 ms a call on an H200, at every layer of an eager step whose shape is new: mixed prefill+verify
# batches), while the memory-efficient kernel takes the boolean mask as is; math is the fallback for shapes
# it refuses.
MASKED_SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def use_attention_kernel(model: nn.Module, kernel: UniformKernel) -> None:
    """Make every attention module of `model` (those with an `attention_kernel`) attend with `kernel`."""
    set_on_modules(model, "attention_kernel", kernel)


class AttentionPlan:
    """Per-forward cache of the metadata-derived tensors every attention layer reads.

    Built by each model forward from the step's AttentionMetadata; `attend` also accepts plain metadata
    (then the plan lives for one call)."""

    def __init__(self, meta: AttentionMetadata, positions: torch.Tensor) -> None:
        self.meta = meta
        self.positions = positions
        self._tensors: dict[tuple, PlanTensors] = {}

    def tensors(self, num_tokens: int, block_size: int, group: int, device: torch.device) -> PlanTensors:
        key = (num_tokens, block_size, group)
        if key not in self._tensors:
            self._tensors[key] = PlanTensors(self.meta, self.positions, num_tokens, block_size, group, device)
        return self._tensors[key]


class PlanTensors:
    """What one forward's attention layers share for a (num_tokens, block_size, group): the tokens' KV slots
    (`slots`, -1 = padding), and, computed on first use, what the gather + SDPA path needs besides (the write
    indices, gathered block ids, padded query layout, the causal mask, the read-back indices). The uniform-batch
    kernel takes the slots as they are (it maps padding itself), so its forward (and the graph that captures it)
    runs none of these kernels.

    `uniform` and `num_key_blocks` (ceil(max_seq_len / block_size), at least 1) are CPU values."""

    def __init__(self, meta: AttentionMetadata, positions: torch.Tensor, num_tokens: int, block_size: int,
                 group: int, device: torch.device) -> None:
        self.meta, self.positions, self.num_tokens = meta, positions, num_tokens
        self.block_size, self.group, self.device = block_size, group, device
        self.uniform = is_uniform(meta, num_tokens)
        self.max_query_len = max(meta.max_query_len, 1)
        self.num_key_blocks = max(-(-meta.max_seq_len // block_size), 1)
        self.slots = meta.slot_mapping[:num_tokens].to(torch.int64)  # int64[T], -1 = padding (a view: int64)
        # made on first use (a plain cache, not functools.cached_property: its lock on Python 3.11 breaks a
        # compiled step's graph)
        self._made: dict[str, object] = {}

    def _once(self, name: str, make):
        if name not in self._made:
            self._made[name] = make()
        return self._made[name]

    def split_counters(self, count: int) -> torch.Tensor:
        """int32[count] zeros, made once a forward when a uniform kernel first splits its keys: its count of
        finished key splits per (row, KV head), which each launch leaves zero for the next layer
        (`triton_attention.paged_attention_uniform`)."""
        return self._once(f"split_counters_{count}", lambda: torch.zeros(count, dtype=torch.int32,
                                                                          device=self.device))

    @property
    def write_index(self) -> torch.Tensor:
        """int64[T]: each token's flat KV slot, padding (-1) mapped to the NULL block's scratch slot."""
        return self._once("write_index", lambda: torch.where(self.slots < 0, padding_slot(self.block_size),
                                                             self.slots))

    @property
    def blocks(self) -> torch.Tensor:
        """int64[R * num_key_blocks]: each row's first num_key_blocks block ids, row after row."""
        return self._once("blocks", lambda: self.meta.block_table[:, :self.num_key_blocks].to(torch.int64)
                          .reshape(-1))

    @property
    def token_of_slot(self) -> torch.Tensor | None:
        """int64[R, Q]: the flat token in each padded query slot (clamped); None for a uniform batch (the padded
        layout is the flat one: row r's queries are tokens r*Q .. r*Q + Q - 1)."""
        return None if self.uniform else self._once("token_of_slot", self._token_of_slot)

    def _token_of_slot(self) -> torch.Tensor:
        num_rows = self.meta.block_table.shape[0]
        starts = self.meta.query_start_loc[:num_rows].to(torch.int64)
        return (starts.unsqueeze(1) + torch.arange(self.max_query_len, device=self.device)).clamp(
            0, max(self.num_tokens - 1, 0))

    @property
    def mask(self) -> torch.Tensor:
        """bool[R, 1, G * Q, num_key_blocks * block_size]: key j visible to a query at position p of row r iff
        j <= p and j < seq_lens[r], key 0 always (see the module doc)."""
        return self._once("mask", self._mask)

    def _mask(self) -> torch.Tensor:
        num_rows, q = self.meta.block_table.shape[0], self.max_query_len
        if self.uniform:
            q_pos = self.positions[:self.num_tokens].view(num_rows, q)
        else:
            q_pos = self.positions[self.token_of_slot]  # [R, Q]
        key_pos = torch.arange(self.num_key_blocks * self.block_size, device=self.device)
        visible = (key_pos <= q_pos.unsqueeze(-1)) & (key_pos < self.meta.seq_lens.to(torch.int64).view(-1, 1, 1))
        visible = visible | (key_pos == 0)  # one key always visible: no empty softmax row (see module doc)
        mask = visible.unsqueeze(1).expand(num_rows, self.group, q, key_pos.numel())
        return mask.reshape(num_rows, 1, self.group * q, key_pos.numel())

    @property
    def rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(row, index in row) of each flat token, int64[T] each (`_token_rows`); None for a uniform batch."""
        return None if self.uniform else self._once("rows", lambda: _token_rows(self.meta, self.num_tokens,
                                                                                self.device))


def is_uniform(meta: AttentionMetadata, num_tokens: int) -> bool:
    """Whether every row of the batch holds exactly `max_query_len` queries, row r at tokens [r*Q, (r+1)*Q).

    CPU ints only (shape-static, fixed at graph capture). T == R * Q holds exactly then: an eager batch has
    no padding (T = sum of query lengths <= R * Q, equal only if every row has Q), and padding only ever
    extends a uniform graph batch with whole padded rows of Q tokens each (real tokens a multiple of Q).
    """
    q = max(meta.max_query_len, 1)
    return num_tokens == meta.block_table.shape[0] * q and meta.num_actual_tokens % q == 0


def padding_slot(block_size: int) -> int:
    """The flat KV slot padded tokens (slot -1) write to: the NULL block's last slot (see the module doc)."""
    return block_size - 1


def write_kv_cache(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor,
                   plan: PlanTensors | None = None) -> None:
    """Store each token's key/value at its slot.

    kv_cache: [2, num_blocks, block_size, Hkv, D] (updated in place); key/value: [T, Hkv, D];
    slot_mapping: int64[T], -1 = padding (lands in the NULL block's scratch slot, :func:`padding_slot`,
    which no row reads unmasked). plan: the forward's shared tensors, whose `write_index` it uses (optional).
    """
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    flat = kv_cache.view(2, -1, *kv_cache.shape[3:])  # [2, num_blocks * block_size, Hkv, D]
    if plan is None:
        slots = slot_mapping[:num_tokens].to(torch.int64)
        index = torch.where(slots < 0, padding_slot(kv_cache.shape[2]), slots)
    else:
        index = plan.write_index
    new_kv = torch.stack((key, value))  # [2, T, Hkv, D]: keys and values written by one index_copy_
    flat.index_copy_(1, index, new_kv if new_kv.dtype == kv_cache.dtype else new_kv.to(kv_cache.dtype))


@dataclass(frozen=True)
class HeadPrologue:
    """What the query and key heads still need before attention, which a uniform-batch kernel may do itself:
    per-head RMSNorms (Qwen3's / LFM2's q and k norms; None: none), then rotate-half RoPE.

    rope: the forward's `rope.RopeTables` (its (cos, signed_sin) tables [T, D] made only if the eager op needs
    them; the kernel computes the angles from its `inv_freq`); apply_rope(x, cos, signed_sin): the eager op;
    q_norm / k_norm: RMSNorm modules (`weight` [D], `eps`) or None."""

    rope: RopeTables
    apply_rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    q_norm: nn.Module | None = None
    k_norm: nn.Module | None = None

    def apply(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager ops: query [T, Hq, D], key [T, Hkv, D] normalised and rotated."""
        if self.q_norm is not None:
            query, key = self.q_norm(query), self.k_norm(key)
        cos, signed_sin = self.rope.tables
        return self.apply_rope(query, cos, signed_sin), self.apply_rope(key, cos, signed_sin)

    def rows(self, start: int, stop: int) -> HeadPrologue:
        """The prologue of tokens [start, stop) (its rope rows), for one segment of a segmented forward."""
        return HeadPrologue(self.rope.rows(start, stop), self.apply_rope, self.q_norm, self.k_norm)

    def kernel_args(self) -> dict:
        """`rope` and `qk_norm` for :func:`triton_attention.paged_attention_uniform`."""
        qk_norm = None
        if self.q_norm is not None:
            if self.q_norm.eps != self.k_norm.eps:
                raise ValueError(f"q and k norms with different eps ({self.q_norm.eps}, {self.k_norm.eps})")
            qk_norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        return {"rope_inv_freq": self.rope.inv_freq, "qk_norm": qk_norm}


def _kernel_takes(kernel: UniformKernel, tensors: PlanTensors, query: torch.Tensor, kv_cache: torch.Tensor,
                  max_query_len: int, *new_kv: torch.Tensor, prologue: dict | None = None) -> bool:
    """Whether `kernel.uniform` runs this batch: a uniform batch on the GPU that the kernel supports."""
    return (kernel.uniform is not None and tensors.uniform and query.is_cuda
            and triton_attention.supports(query, kv_cache, max_query_len, *new_kv, **(prologue or {})))


def _row_split(kernel: UniformKernel, tensors: PlanTensors, query: torch.Tensor, kv_cache: torch.Tensor,
               max_query_len: int) -> int:
    """Into how many sub-rows each row of a uniform batch is cut so `kernel.uniform` takes it, when its rows hold
    more queries than one kernel program does (a prompt chunk: G * Q > MAX_QUERY_ROWS); 1 when the batch needs no
    cut or the kernel cannot take it. Sub-row j of a row holds its queries j*Q/s .. (j+1)*Q/s - 1 and reads the
    row's blocks: causality comes from each query's position, so the cut changes nothing but the grid."""
    group = query.shape[1] // kv_cache.shape[3]
    if kernel.uniform is None or not tensors.uniform or not query.is_cuda:
        return 1
    if group * max_query_len <= triton_attention.MAX_QUERY_ROWS:
        return 1
    split = next(s for s in range(2, max_query_len + 1)
                 if max_query_len % s == 0 and group * (max_query_len // s) <= triton_attention.MAX_QUERY_ROWS)
    return split if triton_attention.supports(query, kv_cache, max_query_len // split) else 1


def _token_rows(meta: AttentionMetadata, num_tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and in-row query index of each flat token: (int64[T], int64[T]), clamped into the padded layout."""
    row = meta.token_req_indices[:num_tokens].to(torch.int64)
    start = meta.query_start_loc.to(torch.int64)[row]
    index_in_row = (torch.arange(num_tokens, device=device) - start).clamp(0, max(meta.max_query_len - 1, 0))
    return row, index_in_row


def paged_attention(
    query: torch.Tensor,
    positions: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata | AttentionPlan,
    scale: float,
    kernel: UniformKernel = SDPA,
) -> torch.Tensor:
    """Causal attention of each token over its row's cached keys (this step's keys already written).

    query: [T, Hq, D]; positions: int64[T] (position of each query token in its request);
    kv_cache: [2, num_blocks, block_size, Hkv, D]; meta: the step's metadata or a forward's AttentionPlan;
    kernel: who takes uniform batches (:class:`specexp.models.kernels.UniformKernel`).
    Returns [T, Hq * D] in query's dtype. Padded tokens/rows get finite garbage; real rows never depend on them.
    """
    plan = meta if isinstance(meta, AttentionPlan) else AttentionPlan(meta, positions)
    meta = plan.meta
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // num_kv_heads
    t = plan.tensors(num_tokens, block_size, group, query.device)
    num_rows = meta.block_table.shape[0]
    max_query_len = max(meta.max_query_len, 1)
    if _kernel_takes(kernel, t, query, kv_cache, max_query_len):
        return kernel.uniform(query, positions, kv_cache, meta.block_table, meta.seq_lens, t.num_key_blocks, scale)
    max_keys = t.num_key_blocks * block_size

    # Dense keys and values of each row, gathered together: [2, R, S, Hkv, D].
    kv = kv_cache.index_select(1, t.blocks).view(2, num_rows, max_keys, num_kv_heads, head_dim)
    if kv.dtype != query.dtype:
        kv = kv.to(query.dtype)
    keys, values = kv.transpose(2, 3).unbind(0)  # each [R, Hkv, S, D]

    # Padded queries, with the G query heads of each KV head folded into the query axis: [R, Hkv, G * Q, D].
    q = query.view(num_rows, max_query_len, num_heads, head_dim) if t.uniform else query[t.token_of_slot]
    q = q.view(num_rows, max_query_len, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(num_rows, num_kv_heads, group * max_query_len, head_dim)
    with sdpa_kernel(MASKED_SDPA_BACKENDS) if q.is_cuda else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=t.mask, scale=scale)
    out = out.view(num_rows, num_kv_heads, group, max_query_len, head_dim).permute(0, 3, 1, 2, 4)
    if t.uniform:
        return out.reshape(num_tokens, num_heads * head_dim)
    out = out.reshape(num_rows, max_query_len, num_heads * head_dim)
    row, index_in_row = t.rows
    return out[row, index_in_row]


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata | AttentionPlan,
    scale: float,
    kernel: UniformKernel = SDPA,
    prologue: HeadPrologue | None = None,
) -> torch.Tensor:
    """Write this step's key/value into the paged cache, then attend (uniform batches with `kernel`).
    query [T, Hq, D], key/value [T, Hkv, D] -> [T, Hq * D]. meta: the step's metadata, or the forward's
    AttentionPlan (shared by layers). prologue: None when query and key are final; else their remaining norms
    and RoPE, which `kernel` applies in its kernel when it takes the batch and the eager ops apply otherwise.
    A `SegmentedPlan` attends each segment's tokens with its own plan (`specexp.models.segments`)."""
    if isinstance(meta, SegmentedPlan):
        return torch.cat([attend(query[a:b], key[a:b], value[a:b], positions[a:b], kv_cache, plan, scale, kernel,
                                 prologue.rows(a, b) if prologue is not None else None)
                          for a, b, plan in meta.parts])
    plan = meta if isinstance(meta, AttentionPlan) else AttentionPlan(meta, positions)
    group = query.shape[1] // key.shape[1]
    block_size = kv_cache.shape[2]
    tensors = plan.tensors(query.shape[0], block_size, group, query.device)
    max_query_len = max(plan.meta.max_query_len, 1)
    extra = prologue.kernel_args() if prologue is not None else {}
    if _kernel_takes(kernel, tensors, query, kv_cache, max_query_len, key, value, prologue=extra):  # one kernel
        return kernel.uniform(query, positions, kv_cache, plan.meta.block_table, plan.meta.seq_lens,
                              tensors.num_key_blocks, scale, key=key, value=value,
                              write_index=tensors.slots, split_counters=tensors.split_counters, **extra)
    if prologue is not None:
        query, key = prologue.apply(query, key)
    write_kv_cache(kv_cache, key, value, plan.meta.slot_mapping, tensors)
    split = _row_split(kernel, tensors, query, kv_cache, max_query_len)
    if split > 1:  # rows too long for one program (prompt chunks): the kernel over sub-rows, keys written above
        meta = plan.meta
        return kernel.uniform(query, positions, kv_cache, meta.block_table.repeat_interleave(split, 0),
                              meta.seq_lens.repeat_interleave(split), tensors.num_key_blocks, scale)
    return paged_attention(query, positions, kv_cache, plan, scale, kernel)
