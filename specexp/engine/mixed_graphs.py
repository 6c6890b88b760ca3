"""Joined mixed-step graphs: prompt chunks and the verify rows beside them in ONE target graph.

Run in parts (`specexp.engine.mixed_steps`), a mixed step replays the verify graph and then a prompt graph per
chunk, so the target reads its weights once per part and pays each graph's fixed costs. A joined graph runs one
segmented forward (`specexp.models.segments`) over all of them: the projections, norms, MLPs and the LM head see
all the step's tokens at once, and only attention and short conv run per segment, each with its own metadata:

    segment 0: the verify rows, padded to a capture size S, v + 1 tokens a row, in the engine's input buffers
               (the verify graph's metadata, short-conv spec rows from the builder's graph buffers);
    segment 1: the m chunks, padded to M rows of C slots (chunk r's tokens at [r*C, r*C + q_r), the rest padding:
               `inputs.stride_rows`), in `chunk_buffers`. Attention reads them as a uniform batch of M rows
               (each real token attends by its position); short conv gathers the real tokens end to end and runs
               them as prefill rows (`short_conv_buffers.PromptRowsGraphBuffers`).

A joined graph is keyed by its chunk shape (M, C) and, like the verify graphs, by (S, v, key-length bucket). The
shapes (`chunk_shapes`): for each prompt-graph count C (`engine.cudagraph_prefill_tokens`), M = 1, 2, 4, ... up to
the chunks of up to C tokens a step's token budget holds, that bound included; a step's m chunks of at most L tokens take the
smallest captured M * C with M >= m, C >= L. S runs over the verify keys' sizes capped at max_num_seqs - M (the
chunks take the last M rows).

A step of chunks alone (no verify row) replays a joined graph too: its verify segment is the smallest capture
size at the smallest captured v, every row of it inert padding (`lookup` with v None).

The rejection sampler scores all S + M rows at once: chunk r's line of `row_inputs` sits at row S + r, scoring
its last token with no drafts, and moves to row R + r (R: the real verify rows' count) after the replay, so the
step's read-back, commit and draft see the batch in the scheduler's order.

The draft's prefill of such a step joins likewise (`draft_mixed_MxC`, C a draft prompt graph's region count, the
target's + 1): the verify rows' regions of v + 2 slots and each chunk's region (its tokens + the sampled token) in
one forward that samples draft token 0 of every row, before the step's one decode graph. The target and the draft
decide on their own; a step neither's joined graphs hold runs in parts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor, CudaGraphManager, graph_key
from specexp.engine.inputs import InputBuffers, uniform_dummy_inputs
from specexp.engine.mixed_steps import rows_of
from specexp.engine.scheduler import ScheduledBatch
from specexp.engine.verified import StagedRows, VerifiedBatch
from specexp.models.metadata import ForwardContext, Segment

ChunkShape = tuple[int, int]  # (M prompt rows, C slots a row)


def chunk_shapes(counts, token_budget: int, max_num_seqs: int) -> tuple[ChunkShape, ...]:
    """The (M, C) chunk shapes joined graphs are captured for: per count C, M = 1, 2, 4, ... below
    min(token_budget // C + 2, max_num_seqs - 1), and that bound itself; none when max_num_seqs is 1. A step's
    budget holds token_budget // C whole chunks of C tokens, plus a partial chunk at each end: the rest of a prompt
    begun the step before, and the head of the last prompt admitted."""
    shapes = set()
    for count in counts:
        bound = min(token_budget // count + 2, max_num_seqs - 1)
        rows = 1
        while rows < bound:
            shapes.add((rows, count))
            rows *= 2
        if bound >= 1:
            shapes.add((bound, count))
    return tuple(sorted(shapes))


def mixed_keys(verify_keys, max_num_seqs: int, num_prompt_rows: int = 1) -> tuple[tuple[int, int], ...]:
    """The (verify rows, v) keys of joined graphs with `num_prompt_rows` chunk rows: each verify key's size,
    capped at max_num_seqs - num_prompt_rows (the chunks take the last rows); none when no row is left."""
    cap = max_num_seqs - num_prompt_rows
    return tuple(sorted({(min(size, cap), v) for size, v in verify_keys})) if cap >= 1 else ()


def joined_inputs(buffers: InputBuffers, num_tokens: int, chunk_buffers: InputBuffers, count: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, positions) int64[num_tokens + count] of a joined forward: the verify segment's first
    num_tokens entries of `buffers`, then the chunks' first `count` (M * C) of `chunk_buffers`."""
    return (torch.cat((buffers.input_ids[:num_tokens], chunk_buffers.input_ids[:count])),
            torch.cat((buffers.positions[:num_tokens], chunk_buffers.positions[:count])))


def joined_context(model_owner, desc: BatchExecutionDescriptor, count: int, attn, conv, chunk_attn, chunk_conv
                   ) -> ForwardContext:
    """The ForwardContext of a joined graph: the verify segment (desc.num_tokens tokens) then the chunks'
    (`count`), each with its own metadata, over `model_owner`'s caches."""
    segments = [Segment(0, desc.num_tokens, attn, conv), Segment(desc.num_tokens, count, chunk_attn, chunk_conv)]
    return ForwardContext(attn=None, conv=None, kv_caches=model_owner.kv_caches, conv_states=model_owner.conv_states,
                          segments=segments)


def move_rows(tensors, src: int, dst: int, num: int) -> None:
    """Rows [src, src + num) of each tensor (None skipped) to rows [dst, dst + num), dst <= src (overlap safe)."""
    if src == dst or num == 0:
        return
    for t in tensors:
        if t is not None:
            t[dst : dst + num] = t[src : src + num].clone()


class MixedGraphs:
    """Joined graphs: per chunk shape (M, C), a `CudaGraphManager` named `name_MxC` over the verify keys capped at
    max_num_seqs - M, at every key-length bucket, a verify row running tokens_per_req + v tokens (the target's
    1 + v, the draft's region of 2 + v slots). `managers`: {(M, C): manager}, ascending (empty: joined graphs
    off)."""

    def __init__(self, name: str, shapes: tuple[ChunkShape, ...], verify_keys, max_num_seqs: int,
                 device: torch.device, seq_len_buckets: tuple[int, ...], enabled: bool, pool: tuple | None = None,
                 tokens_per_req: int = 1) -> None:
        self.managers: dict[ChunkShape, CudaGraphManager] = {}
        for rows, count in (sorted(shapes) if enabled else ()):
            keys = mixed_keys(verify_keys, max_num_seqs, rows)
            if keys:
                self.managers[(rows, count)] = CudaGraphManager(
                    f"{name}_{rows}x{count}", sorted({size for size, _ in keys}), tokens_per_req, device,
                    seq_len_buckets=seq_len_buckets, pool=pool, tokens_per_draft=1, capture_keys=keys)
        # smallest chunk segment first: the lookup's order
        self._by_cost = sorted(self.managers, key=lambda shape: (shape[0] * shape[1], shape))

    @property
    def max_rows(self) -> int:
        return max((rows for rows, _ in self.managers), default=1)

    @property
    def max_tokens(self) -> int:
        return max((rows * count for rows, count in self.managers), default=1)

    def lookup(self, num_verify: int, v: int | None, chunk_lens: list[int], max_seq_len: int
               ) -> tuple[BatchExecutionDescriptor, CudaGraphManager, ChunkShape] | None:
        """The joined graph of `num_verify` verify rows at depth v beside chunks of `chunk_lens` tokens (slots),
        the batch's longest row reaching max_seq_len keys: (the verify segment's descriptor, its manager, its chunk
        shape), or None. Counts nothing. Chunks alone (num_verify 0, v None) take the smallest verify segment of
        the smallest captured v, all of it inert padding."""
        num, longest = len(chunk_lens), max(chunk_lens)
        for shape in self._by_cost:
            if shape[0] >= num and shape[1] >= longest:
                manager = self.managers[shape]
                for depth in ((v,) if v is not None else sorted({k for _, k in manager.keys})):
                    desc = manager.lookup(num_verify, max_seq_len, depth)
                    if desc is not None:
                        return desc, manager, shape
        return None

    def capture(self, fn: Callable[[ChunkShape, BatchExecutionDescriptor], None],
                prepare: Callable[[ChunkShape, BatchExecutionDescriptor], None], progress=None) -> None:
        """Capture every shape's graphs, largest first; fn(shape, desc) / prepare(shape, desc) as the managers'."""
        for shape in sorted(self.managers, key=lambda s: s[0] * s[1], reverse=True):
            self.managers[shape].capture(functools.partial(fn, shape), functools.partial(prepare, shape), progress)


class TargetMixedGraphs:
    """The joined half of `NativeEngine`'s mixed steps (a mixin: it reads the engine's buffers, `chunk_buffers`,
    conv builder and sampler)."""

    def _init_mixed_graphs(self) -> None:
        """The joined graphs of the engine's prompt-graph counts and verify keys (none unless
        `engine.cudagraph_mixed` is "joined"), and the buffers their chunk segment reads."""
        self.mixed_chunk_shapes = chunk_shapes(tuple(self.prefill_graphs.managers), self.cfg.token_budget,
                                               self.cfg.max_num_seqs)
        self.mixed_graphs = MixedGraphs(
            "target_mixed", self.mixed_chunk_shapes, self.graph_keys.verify, self.cfg.max_num_seqs, self.device,
            tuple(self.seq_len_buckets), enabled=self.use_graphs and self.cfg.cudagraph_mixed == "joined",
            pool=self.graph_pool)
        graphs = self.mixed_graphs
        self.chunk_buffers = InputBuffers(graphs.max_rows, graphs.max_tokens, self.max_blocks_per_req, self.device)
        if self.conv_states and graphs.managers:
            self.conv_builder.allocate_prompt_rows(max_rows=graphs.max_rows, max_tokens=graphs.max_tokens)
        self._mixed_graph_ctx: dict[tuple, ForwardContext] = {}  # by (M, C, rows, v, bucket)

    def _prepare_mixed_capture(self, shape: ChunkShape, desc: BatchExecutionDescriptor) -> None:
        """An inert joined batch: desc.num_reqs verify rows of v + 1 tokens, then M prompt rows of C."""
        num_rows, count = shape
        query_len = desc.num_speculative_tokens + 1
        self.buffers.load(uniform_dummy_inputs(desc.num_reqs, query_len, self.max_blocks_per_req))
        self.row_inputs[: desc.num_reqs + num_rows].zero_()
        attn = self.buffers.attention_metadata(desc.num_reqs, desc.num_tokens, desc.max_seq_len, query_len,
                                               desc.num_tokens)
        chunk_attn = self.chunk_buffers.load_inert_prompt_rows(num_rows, count, desc.max_seq_len)
        conv = chunk_conv = None
        if self.conv_states:
            conv = self.conv_builder.build_for_cudagraph_capture(num_reqs=desc.num_reqs, num_tokens=desc.num_tokens,
                                                                 query_len=query_len)
            chunk_conv = self.conv_builder.build_for_prompt_rows_capture(num_rows=num_rows, row_tokens=count)
        self._mixed_graph_ctx[(*shape, *graph_key(desc))] = joined_context(
            self, desc, num_rows * count, attn, conv, chunk_attn, chunk_conv)

    def _mixed_graph(self, shape: ChunkShape, desc: BatchExecutionDescriptor) -> None:
        """The captured joined step: one segmented target forward over the verify rows' tokens and the chunks',
        then the rejection sampler over all desc.num_reqs + M rows (the chunks' are the last)."""
        ctx = self._mixed_graph_ctx[(*shape, *graph_key(desc))]
        input_ids, positions = joined_inputs(self.buffers, desc.num_tokens, self.chunk_buffers, shape[0] * shape[1])
        hidden = self.target(input_ids, positions, ctx)
        rows = desc.num_reqs + shape[0]
        self._sample(self._logits_at_scoring_rows(hidden, rows, desc.num_speculative_tokens), rows)

    def _verify_joined(self, batch: ScheduledBatch, num_verify: int,
                       joined: tuple[BatchExecutionDescriptor, CudaGraphManager, ChunkShape]) -> VerifiedBatch | None:
        """Stage the verify rows and the chunks as the two segments of `joined` and replay it, leaving
        `step_out[:R]` and `row_inputs[:R]` in the batch's row order; returns what the speculator needs of the
        whole batch (None without a speculator)."""
        desc, manager, (num_rows, count) = joined
        rows, k = batch.rows, batch.num_speculative_tokens
        chunks = rows[num_verify:]
        preps = [self._prepare_target_inputs(ScheduledBatch(rows[:num_verify], k), desc),
                 self._prepare_target_inputs(ScheduledBatch(chunks, k),
                                             BatchExecutionDescriptor(num_rows, num_rows * count, FULL,
                                                                      desc.max_seq_len),
                                             buffers=self.chunk_buffers, row_offset=desc.num_reqs,
                                             token_offset=desc.num_tokens, row_stride=count)]
        manager.replay(desc)
        move_rows((self.step_out, self.row_inputs), desc.num_reqs, num_verify, len(chunks))
        if not self.drafting:
            return None
        chunk_ids = preps[1]["real_input_ids"]
        input_ids = [self.buffers.input_ids[: preps[0]["cpu"].num_tokens],
                     (chunk_ids.pin_memory() if self.pin_memory else chunk_ids).to(self.device, non_blocking=True)]
        return self._joined_verified(batch, preps, input_ids)


class DraftMixedGraphs:
    """The joined half of the draft's prefill in a mixed step (a mixin of `AutoRegressiveSpeculator`): the verify
    rows' regions (v + 2 slots a row, in `prefill_buffers`) and the chunks' regions (each its tokens + the sampled
    one, rows of C slots in `chunk_prefill_buffers`) in one segmented draft forward, which samples draft token 0
    of every row; the one decode graph of the step follows as in any step."""

    def _init_mixed_graphs(self, keys, shapes: tuple[ChunkShape, ...], buckets: tuple[int, ...], pool: tuple | None,
                           enabled: bool) -> None:
        """Joined graphs per chunk shape (M, C: C a draft prompt graph's region count) and verify key."""
        self.mixed_graphs = graphs = MixedGraphs("draft_mixed", shapes, keys, self.max_num_reqs, self.device, buckets,
                                                 enabled, pool, tokens_per_req=2)
        self.chunk_prefill_buffers = InputBuffers(graphs.max_rows, graphs.max_tokens,
                                                  self.prefill_buffers.block_table.shape[1], self.device)
        if self.conv_states and graphs.managers:
            self.prefill_conv_builder.allocate_prompt_rows(max_rows=graphs.max_rows, max_tokens=graphs.max_tokens)
        self._mixed_graph_ctx: dict[tuple, ForwardContext] = {}

    def _prepare_mixed_capture(self, shape: ChunkShape, desc: BatchExecutionDescriptor) -> None:
        """An inert joined batch: desc.num_reqs regions of v + 2 slots, then M prompt regions of C slots."""
        num_rows, count = shape
        region = desc.num_speculative_tokens + 2
        cpu = uniform_dummy_inputs(desc.num_reqs, region, self.prefill_buffers.block_table.shape[1])
        self.prefill_buffers.load(cpu)
        self.last_token_indices[: desc.num_reqs].copy_(cpu.query_start_loc[:-1].to(self.device))
        self.last_token_indices[desc.num_reqs : desc.num_reqs + num_rows].copy_(
            desc.num_tokens + torch.arange(num_rows) * count)
        attn = self.prefill_buffers.attention_metadata(desc.num_reqs, desc.num_tokens, desc.max_seq_len, region,
                                                       desc.num_tokens)
        chunk_attn = self.chunk_prefill_buffers.load_inert_prompt_rows(num_rows, count, desc.max_seq_len)
        conv = chunk_conv = None
        if self.conv_states:
            builder = self.prefill_conv_builder
            conv = builder.build_for_cudagraph_capture(num_reqs=desc.num_reqs, num_tokens=desc.num_tokens,
                                                       query_len=region)
            chunk_conv = builder.build_for_prompt_rows_capture(num_rows=num_rows, row_tokens=count, state_lookahead=1)
        self._mixed_graph_ctx[(*shape, *graph_key(desc))] = joined_context(
            self, desc, num_rows * count, attn, conv, chunk_attn, chunk_conv)

    def _mixed_graph(self, shape: ChunkShape, desc: BatchExecutionDescriptor) -> None:
        """The captured joined draft prefill: one segmented forward over every region, draft token 0 of each of
        the desc.num_reqs + M rows sampled at its new token (the chunks' rows are the last)."""
        ctx = self._mixed_graph_ctx[(*shape, *graph_key(desc))]
        input_ids, positions = joined_inputs(self.prefill_buffers, desc.num_tokens, self.chunk_prefill_buffers,
                                             shape[0] * shape[1])
        hidden = self.model(input_ids, positions, ctx)
        rows = desc.num_reqs + shape[0]
        self._sample_draft(self.model.compute_logits(hidden[self.last_token_indices[:rows]]), rows, 0)

    def _prefill_joined(self, batch: VerifiedBatch, num_verify: int,
                        joined: tuple[BatchExecutionDescriptor, CudaGraphManager, ChunkShape]) -> StagedRows:
        """Stage the verify rows' regions and the chunks' as the two segments of `joined` and replay it, leaving
        row r's draft 0 (its probabilities and draft length) at row r; returns the rows' device facts for the
        decode steps, in the batch's order."""
        desc, manager, (num_rows, count) = joined
        num_reqs = batch.query_lens.numel()
        staged = [self._prepare_prefill_inputs(rows_of(batch, 0, num_verify), desc),
                  self._prepare_prefill_inputs(rows_of(batch, num_verify, num_reqs),
                                               BatchExecutionDescriptor(num_rows, num_rows * count, FULL,
                                                                        desc.max_seq_len),
                                               buffers=self.chunk_prefill_buffers, row_offset=desc.num_reqs,
                                               token_offset=desc.num_tokens, row_stride=count)]
        self.on_prefill_begin(desc.num_reqs + num_rows)
        manager.replay(desc)
        self.on_prefill_end(desc.num_reqs + num_rows)
        move_rows((self.draft_tokens, self.draft_probs, self.draft_lengths), desc.num_reqs, num_verify,
                  num_reqs - num_verify)
        return StagedRows(*(torch.cat([getattr(s, name) for s in staged]) for name in ("num_valid", "start", "samples")))
