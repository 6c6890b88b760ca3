"""A minimal stand-in for the engine, for model tests: paged caches + non-speculative step metadata.

`PagedRunner.step([(request_id, new_token_ids), ...])` runs one flattened forward of those requests
(continuing each from the tokens it already ran) and returns each request's logits for its new tokens.
Rows are ordered decodes (1 token) first, then prefills (> 1 token), as the engine orders them; KV blocks
and conv-state slots are handed out from 1 up (0 is the NULL block/slot). Optional graph-style padding:
extra rows (seq_len 0, NULL slot, zero tokens) and extra tokens (slot -1) past the real ones, and a fixed
`max_seq_len` / `max_query_len` bound instead of the batch's own maxima.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from specexp.models import (
    NULL_BLOCK_ID,
    AttentionMetadata,
    ForwardContext,
    ShortConvMetadata,
    allocate_conv_states,
    allocate_kv_caches,
)


@dataclass
class RequestState:
    conv_slot: int
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # int64[T]
    positions: torch.Tensor  # int64[T]
    ctx: ForwardContext
    rows: list  # (request_id, new_tokens) in batch-row order
    states: list[RequestState]
    query_start_loc: list[int]  # python copy, padded rows included


def to_device(metadata, device: torch.device):
    """A copy of a metadata dataclass with every tensor field moved to `device`."""
    moved = {f.name: getattr(metadata, f.name) for f in fields(metadata)}
    return replace(metadata, **{k: v.to(device) for k, v in moved.items() if isinstance(v, torch.Tensor)})


def _int32(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32)


def _offsets(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def paged_step(token_lists: list[list[int]], states: list, kv_slots_for, max_blocks_per_req: int, *,
               pad_rows: int = 0, pad_tokens: int = 0, max_seq_len: int | None = None,
               max_query_len: int | None = None) -> tuple[list[int], list[int], list[int], AttentionMetadata]:
    """The flat inputs and paged attention metadata of one step, as the engine builds them.

    token_lists: each row's new tokens, continuing `states[r]` (`.blocks`, `.num_computed`);
    kv_slots_for(state, n): the flat KV slots of the state's next n positions (allocating blocks).
    Graph-style padding: `pad_rows` rows that own no token (seq_len 0, NULL blocks) and `pad_tokens`
    tokens (id 0, position 0, slot -1) past the real ones. Returns (input_ids, positions, query_start_loc
    with padded rows, metadata), the lists padded too.
    """
    lengths = [len(tokens) for tokens in token_lists]
    qsl = _offsets(lengths)
    num_real = qsl[-1]
    input_ids, positions, slot_mapping, token_rows, seq_lens, block_table = [], [], [], [], [], []
    for row, (tokens, state) in enumerate(zip(token_lists, states, strict=True)):
        input_ids += tokens
        positions += range(state.num_computed, state.num_computed + len(tokens))
        slot_mapping += kv_slots_for(state, len(tokens))
        token_rows += [row] * len(tokens)
        seq_lens.append(state.num_computed + len(tokens))
        block_table.append(state.blocks + [NULL_BLOCK_ID] * (max_blocks_per_req - len(state.blocks)))
    qsl += [num_real] * pad_rows
    seq_lens += [0] * pad_rows
    block_table += [[NULL_BLOCK_ID] * max_blocks_per_req] * pad_rows
    input_ids += [0] * pad_tokens
    positions += [0] * pad_tokens
    slot_mapping += [-1] * pad_tokens
    token_rows += [0] * pad_tokens
    attn = AttentionMetadata(
        query_start_loc=_int32(qsl),
        seq_lens=_int32(seq_lens),
        block_table=torch.tensor(block_table, dtype=torch.int32),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
        token_req_indices=torch.tensor(token_rows, dtype=torch.int64),
        max_seq_len=max_seq_len or max(seq_lens),
        max_query_len=max_query_len or max(lengths),
        num_actual_tokens=num_real,
    )
    return input_ids, positions, qsl, attn


class PagedRunner:
    """Owns one model's caches and the per-request block lists / conv slots of a test."""

    def __init__(self, model, num_blocks: int = 64, block_size: int = 4, max_reqs: int = 8,
                 max_blocks_per_req: int = 16, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        self.model = model
        self.device = torch.device(device)
        self.block_size = block_size
        self.max_blocks_per_req = max_blocks_per_req
        self.kv_caches = allocate_kv_caches(model, num_blocks, block_size, device, dtype)
        self.conv_states = allocate_conv_states(model, max_reqs + 1, 0, device, dtype)
        self.free_blocks = list(range(1, num_blocks))
        self.free_slots = list(range(1, max_reqs + 1))
        self.requests: dict[object, RequestState] = {}
        self.last_hidden: torch.Tensor | None = None

    def finish(self, request_id) -> None:
        """Free a request's blocks and conv slot (stale contents stay behind, as in the engine)."""
        state = self.requests.pop(request_id)
        self.free_blocks.extend(state.blocks)
        self.free_slots.append(state.conv_slot)

    def _state(self, request_id) -> RequestState:
        if request_id not in self.requests:
            self.requests[request_id] = RequestState(conv_slot=self.free_slots.pop(0))
        return self.requests[request_id]

    def _slots_for(self, state: RequestState, num_new: int) -> list[int]:
        positions = range(state.num_computed, state.num_computed + num_new)
        while len(state.blocks) * self.block_size < state.num_computed + num_new:
            state.blocks.append(self.free_blocks.pop(0))
        return [state.blocks[p // self.block_size] * self.block_size + p % self.block_size for p in positions]

    def prepare(self, batch: list[tuple[object, list[int]]], pad_rows: int = 0, pad_tokens: int = 0,
                max_seq_len: int | None = None, max_query_len: int | None = None) -> StepInputs:
        """The flat inputs and ForwardContext of one step over `batch` (allocates blocks/slots as needed)."""
        rows = [r for r in batch if len(r[1]) == 1] + [r for r in batch if len(r[1]) > 1]  # decodes first
        states = [self._state(rid) for rid, _ in rows]
        input_ids, positions, qsl, attn = paged_step(
            [tokens for _, tokens in rows], states, self._slots_for, self.max_blocks_per_req, pad_rows=pad_rows,
            pad_tokens=pad_tokens, max_seq_len=max_seq_len, max_query_len=max_query_len)
        ctx = ForwardContext(
            attn=attn, conv=self._conv_metadata(rows, states, qsl, pad_rows),
            kv_caches=self.kv_caches, conv_states=self.conv_states,
        )
        ctx.attn, ctx.conv = to_device(ctx.attn, self.device), to_device(ctx.conv, self.device)
        return StepInputs(torch.tensor(input_ids, device=self.device), torch.tensor(positions, device=self.device),
                          ctx, rows, states, qsl)

    @torch.no_grad()
    def step(self, batch: list[tuple[object, list[int]]], **padding) -> dict[object, torch.Tensor]:
        """One forward over `batch`; returns {request_id: float32[len(new_tokens), vocab]}. `padding`: see
        `prepare`."""
        inputs = self.prepare(batch, **padding)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.ctx)
        self.last_hidden = hidden
        qsl = inputs.query_start_loc
        logits = self.model.compute_logits(hidden[: qsl[-1]])
        for (_, tokens), state in zip(inputs.rows, inputs.states):
            state.num_computed += len(tokens)
        return {rid: logits[qsl[i]:qsl[i + 1]] for i, (rid, _) in enumerate(inputs.rows)}

    @staticmethod
    def _conv_metadata(rows, states, qsl, pad_rows) -> ShortConvMetadata:
        """Non-speculative short-conv metadata: every row is a decode or a prefill row (padding: prefill
        rows of zero tokens on the NULL slot)."""
        lengths = [len(tokens) for _, tokens in rows]
        num_decodes = sum(1 for n in lengths if n == 1)
        decode_states, prefill_states = states[:num_decodes], states[num_decodes:]
        prefill_lengths = lengths[num_decodes:]
        has_initial_d = [s.num_computed > 0 for s in decode_states]
        has_initial_p = [s.num_computed > 0 for s in prefill_states] + [False] * pad_rows
        slots = [s.conv_slot for s in states] + [NULL_BLOCK_ID] * pad_rows
        qsl_t = _int32(qsl)
        return ShortConvMetadata(
            num_prefills=len(prefill_states),
            num_prefill_tokens=sum(prefill_lengths),
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
            num_spec_decodes=0,
            num_spec_decode_tokens=0,
            num_actual_tokens=qsl[-1],
            spec_query_len=1,
            max_prefill_query_len=max(prefill_lengths, default=0),
            query_start_loc=qsl_t,
            state_indices_tensor=_int32(slots),
            has_initial_states_d=torch.tensor(has_initial_d, dtype=torch.bool) if num_decodes else None,
            has_initial_states_p=torch.tensor(has_initial_p, dtype=torch.bool) if has_initial_p else None,
            non_spec_query_start_loc=qsl_t,
            query_start_loc_d=qsl_t[: num_decodes + 1],
            query_start_loc_p=qsl_t[num_decodes:] - qsl[num_decodes],
            state_indices_tensor_d=_int32(slots[:num_decodes]),
            state_indices_tensor_p=_int32(slots[num_decodes:]),
            num_computed_tokens_p=_int32([s.num_computed for s in prefill_states] + [0] * pad_rows),
        )
