"""Joined mixed-step graphs: a prompt chunk and the verify rows beside it in ONE target graph.

Run in parts (`specexp.engine.mixed_steps`), a mixed step replays the verify graph and then a prompt graph, so
the target reads its weights twice and pays two graphs' fixed costs. A joined graph runs one segmented forward
(`specexp.models.segments`) over both: the projections, norms, MLPs and the LM head see all the step's tokens
at once, and only attention and short conv run per segment, each with the metadata its own graph kind already
has:

    segment 0: the verify rows, padded to a capture size S, v + 1 tokens a row, in the engine's input buffers
               (the verify graph's metadata, short-conv spec rows from the builder's graph buffers);
    segment 1: the chunk, one row padded to a prompt-graph count C, in a one-row `chunk_buffers` (the prompt
               graph's metadata, short-conv from the builder's prompt-row buffers).

The rejection sampler scores all S + 1 rows at once: the chunk's line of `row_inputs` sits at row S, scoring its
last token with no drafts, and moves to row R (the real verify rows' count) after the replay, so the step's
read-back, commit and draft see the batch in the scheduler's order. One manager per C (`target_mixed_C`), keyed
like the verify graphs by (size, v, key-length bucket), at the verify keys' sizes below max_num_seqs (plus
max_num_seqs - 1, the most verify rows that leave room for a chunk).

The draft's prefill of such a step joins likewise (`draft_mixed_C`, C a draft prompt graph's region count): the
verify rows' regions of v + 2 slots and the chunk's region (its tokens + the sampled token) in one forward that
samples draft token 0 of every row, before the step's one decode graph. The target and the draft decide on their
own; a step neither's joined graphs hold runs in parts (`specexp.engine.mixed_steps`).
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


def mixed_keys(verify_keys, max_num_seqs: int) -> tuple[tuple[int, int], ...]:
    """The (verify rows, v) keys joined graphs are captured for: each verify key's size, capped at
    max_num_seqs - 1 (a chunk takes the last row); none when max_num_seqs is 1."""
    return tuple(sorted({(min(size, max_num_seqs - 1), v) for size, v in verify_keys if max_num_seqs > 1}))


def joined_inputs(buffers: InputBuffers, num_tokens: int, chunk_buffers: InputBuffers, count: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, positions) int64[num_tokens + count] of a joined forward: the verify segment's first
    num_tokens entries of `buffers`, then the chunk's first `count` of `chunk_buffers`."""
    return (torch.cat((buffers.input_ids[:num_tokens], chunk_buffers.input_ids[:count])),
            torch.cat((buffers.positions[:num_tokens], chunk_buffers.positions[:count])))


def joined_context(model_owner, desc: BatchExecutionDescriptor, count: int, attn, conv, chunk_attn, chunk_conv
                   ) -> ForwardContext:
    """The ForwardContext of a joined graph: the verify segment (desc.num_tokens tokens) then the chunk's (`count`),
    each with its own metadata, over `model_owner`'s caches."""
    segments = [Segment(0, desc.num_tokens, attn, conv), Segment(desc.num_tokens, count, chunk_attn, chunk_conv)]
    return ForwardContext(attn=None, conv=None, kv_caches=model_owner.kv_caches, conv_states=model_owner.conv_states,
                          segments=segments)


class MixedGraphs:
    """The target's joined graphs: per chunk count C (a prompt-graph count), a `CudaGraphManager` named
    `name_C` over `keys` (verify rows, v) at every key-length bucket, a verify row running tokens_per_req + v
    tokens (the target's 1 + v, the draft's region of 2 + v slots). `managers`: {C: manager}, ascending (empty:
    joined graphs off)."""

    def __init__(self, name: str, chunk_tokens, keys: tuple[tuple[int, int], ...], device: torch.device,
                 seq_len_buckets: tuple[int, ...], enabled: bool, pool: tuple | None = None,
                 tokens_per_req: int = 1) -> None:
        sizes = sorted({size for size, _ in keys})
        counts = sorted(set(chunk_tokens)) if enabled and keys else []
        self.managers = {c: CudaGraphManager(f"{name}_{c}", sizes, tokens_per_req, device,
                                             seq_len_buckets=seq_len_buckets, pool=pool, tokens_per_draft=1,
                                             capture_keys=keys)
                         for c in counts}

    def lookup(self, num_verify: int, v: int, chunk_tokens: int, max_seq_len: int
               ) -> tuple[BatchExecutionDescriptor, CudaGraphManager, int] | None:
        """The joined graph of `num_verify` verify rows at depth v beside one chunk of `chunk_tokens` tokens, the
        batch's longest row reaching max_seq_len keys: (the verify segment's descriptor, its manager, C), or
        None. Counts nothing."""
        count = next((c for c in self.managers if c >= chunk_tokens), None)
        if count is None:
            return None
        desc = self.managers[count].lookup(num_verify, max_seq_len, v)
        return None if desc is None else (desc, self.managers[count], count)

    def capture(self, fn: Callable[[int, BatchExecutionDescriptor], None],
                prepare: Callable[[int, BatchExecutionDescriptor], None], progress=None) -> None:
        """Capture every count's graphs, largest first; fn(C, desc) / prepare(C, desc) as the managers' own."""
        for count in sorted(self.managers, reverse=True):
            self.managers[count].capture(functools.partial(fn, count), functools.partial(prepare, count), progress)


class TargetMixedGraphs:
    """The joined half of `NativeEngine`'s mixed steps (a mixin: it reads the engine's buffers, `chunk_buffers`,
    conv builder and sampler)."""

    num_mixed_joined: int = 0

    def _init_mixed_graphs(self) -> None:
        """The joined graphs of the engine's prompt-graph counts and verify keys (none unless
        `engine.cudagraph_mixed` is "joined"), and the one-row buffers their chunk segment reads."""
        counts = tuple(self.prefill_graphs.managers)
        self.chunk_buffers = InputBuffers(1, max(counts, default=1), self.max_blocks_per_req, self.device)
        self.mixed_graphs = MixedGraphs(
            "target_mixed", counts, mixed_keys(self.graph_keys.verify, self.cfg.max_num_seqs), self.device,
            tuple(self.seq_len_buckets), enabled=self.use_graphs and self.cfg.cudagraph_mixed == "joined",
            pool=self.graph_pool)
        self._mixed_graph_ctx: dict[tuple[int, int, int, int], ForwardContext] = {}  # by (C, rows, v, bucket)

    def _prepare_mixed_capture(self, count: int, desc: BatchExecutionDescriptor) -> None:
        """An inert joined batch: desc.num_reqs verify rows of v + 1 tokens, then one prompt row of `count`."""
        query_len = desc.num_speculative_tokens + 1
        self.buffers.load(uniform_dummy_inputs(desc.num_reqs, query_len, self.max_blocks_per_req))
        self.row_inputs[: desc.num_reqs + 1].zero_()
        attn = self.buffers.attention_metadata(desc.num_reqs, desc.num_tokens, desc.max_seq_len, query_len,
                                               desc.num_tokens)
        chunk_attn = self.chunk_buffers.load_inert_prompt(count, desc.max_seq_len)
        conv = chunk_conv = None
        if self.conv_states:
            conv = self.conv_builder.build_for_cudagraph_capture(num_reqs=desc.num_reqs, num_tokens=desc.num_tokens,
                                                                 query_len=query_len)
            chunk_conv = self.conv_builder.build_for_prompt_capture(num_tokens=count)
        self._mixed_graph_ctx[(count, *graph_key(desc))] = joined_context(self, desc, count, attn, conv, chunk_attn,
                                                                           chunk_conv)

    def _mixed_graph(self, count: int, desc: BatchExecutionDescriptor) -> None:
        """The captured joined step: one segmented target forward over the verify rows' tokens and the chunk's,
        then the rejection sampler over all desc.num_reqs + 1 rows (the chunk's is the last)."""
        ctx = self._mixed_graph_ctx[(count, *graph_key(desc))]
        input_ids, positions = joined_inputs(self.buffers, desc.num_tokens, self.chunk_buffers, count)
        hidden = self.target(input_ids, positions, ctx)
        rows = desc.num_reqs + 1
        self._sample(self._logits_at_scoring_rows(hidden, rows, desc.num_speculative_tokens), rows)

    def _verify_joined(self, batch: ScheduledBatch, num_verify: int,
                       joined: tuple[BatchExecutionDescriptor, CudaGraphManager, int]) -> VerifiedBatch | None:
        """Stage the verify rows and the chunk as the two segments of `joined` and replay it, leaving
        `step_out[:R]` and `row_inputs[:R]` in the batch's row order; returns what the speculator needs of the
        whole batch (None without a speculator)."""
        desc, manager, count = joined
        rows, k = batch.rows, batch.num_speculative_tokens
        chunk = rows[num_verify]
        preps = [self._prepare_target_inputs(ScheduledBatch(rows[:num_verify], k), desc),
                 self._prepare_target_inputs(ScheduledBatch([chunk], k),
                                             BatchExecutionDescriptor(1, count, FULL, desc.max_seq_len),
                                             buffers=self.chunk_buffers, row_offset=desc.num_reqs,
                                             token_offset=desc.num_tokens)]
        manager.replay(desc)
        if desc.num_reqs != num_verify:  # the chunk's row to its place in the batch
            self.step_out[num_verify].copy_(self.step_out[desc.num_reqs])
            self.row_inputs[num_verify].copy_(self.row_inputs[desc.num_reqs])
        if self.speculator is None:
            return None
        input_ids = [self.buffers.input_ids[: preps[0]["cpu"].num_tokens],
                     self.chunk_buffers.input_ids[: chunk.num_query_tokens]]
        return self._joined_verified(batch, preps, input_ids)


class DraftMixedGraphs:
    """The joined half of the draft's prefill in a mixed step (a mixin of `AutoRegressiveSpeculator`): the verify
    rows' regions (v + 2 slots a row, in `prefill_buffers`) and the chunk's region (its tokens + the sampled one,
    in `chunk_prefill_buffers`) in one segmented draft forward, which samples draft token 0 of every row; the one
    decode graph of the step follows as in any step."""

    num_mixed_joined: int = 0

    def _init_mixed_graphs(self, keys, buckets: tuple[int, ...], pool: tuple | None, enabled: bool) -> None:
        """Joined graphs per prompt-region count (the draft's prompt graphs') and verify key (`mixed_keys`)."""
        counts = tuple(self.prompt_graphs.managers)
        self.chunk_prefill_buffers = InputBuffers(1, max(counts, default=1), self.prefill_buffers.block_table.shape[1],
                                                  self.device)
        self.mixed_graphs = MixedGraphs("draft_mixed", counts, mixed_keys(keys, self.max_num_reqs), self.device,
                                        buckets, enabled, pool, tokens_per_req=2)
        self._mixed_graph_ctx: dict[tuple[int, int, int, int], ForwardContext] = {}

    def _prepare_mixed_capture(self, count: int, desc: BatchExecutionDescriptor) -> None:
        """An inert joined batch: desc.num_reqs regions of v + 2 slots, then one prompt region of `count` slots."""
        region = desc.num_speculative_tokens + 2
        cpu = uniform_dummy_inputs(desc.num_reqs, region, self.prefill_buffers.block_table.shape[1])
        self.prefill_buffers.load(cpu)
        self.last_token_indices[: desc.num_reqs].copy_(cpu.query_start_loc[:-1].to(self.device))
        self.last_token_indices[desc.num_reqs].fill_(desc.num_tokens)
        attn = self.prefill_buffers.attention_metadata(desc.num_reqs, desc.num_tokens, desc.max_seq_len, region,
                                                       desc.num_tokens)
        chunk_attn = self.chunk_prefill_buffers.load_inert_prompt(count, desc.max_seq_len)
        conv = chunk_conv = None
        if self.conv_states:
            builder = self.prefill_conv_builder
            conv = builder.build_for_cudagraph_capture(num_reqs=desc.num_reqs, num_tokens=desc.num_tokens,
                                                       query_len=region)
            chunk_conv = builder.build_for_prompt_capture(num_tokens=count, state_lookahead=1)
        self._mixed_graph_ctx[(count, *graph_key(desc))] = joined_context(self, desc, count, attn, conv, chunk_attn,
                                                                           chunk_conv)

    def _mixed_graph(self, count: int, desc: BatchExecutionDescriptor) -> None:
        """The captured joined draft prefill: one segmented forward over every region, draft token 0 of each of
        the desc.num_reqs + 1 rows sampled at its new token (the chunk's row is the last)."""
        ctx = self._mixed_graph_ctx[(count, *graph_key(desc))]
        input_ids, positions = joined_inputs(self.prefill_buffers, desc.num_tokens, self.chunk_prefill_buffers, count)
        hidden = self.model(input_ids, positions, ctx)
        rows = desc.num_reqs + 1
        self._sample_draft(self.model.compute_logits(hidden[self.last_token_indices[:rows]]), rows, 0)

    def _prefill_joined(self, batch: VerifiedBatch, num_verify: int,
                        joined: tuple[BatchExecutionDescriptor, CudaGraphManager, int]) -> StagedRows:
        """Stage the verify rows' regions and the chunk's as the two segments of `joined` and replay it, leaving
        row r's draft 0 (its probabilities and draft length) at row r; returns the rows' device facts for the
        decode steps, in the batch's order."""
        desc, manager, count = joined
        staged = [self._prepare_prefill_inputs(rows_of(batch, 0, num_verify), desc),
                  self._prepare_prefill_inputs(rows_of(batch, num_verify, num_verify + 1),
                                               BatchExecutionDescriptor(1, count, FULL, desc.max_seq_len),
                                               buffers=self.chunk_prefill_buffers, row_offset=desc.num_reqs,
                                               token_offset=desc.num_tokens)]
        self.on_prefill_begin(desc.num_reqs + 1)
        manager.replay(desc)
        self.on_prefill_end(desc.num_reqs + 1)
        if desc.num_reqs != num_verify:  # the chunk's row to its place in the batch
            for t in (self.draft_tokens, self.draft_probs, self.draft_lengths):
                if t is not None:
                    t[num_verify].copy_(t[desc.num_reqs])
        return StagedRows(*(torch.cat([getattr(s, name) for s in staged]) for name in ("num_valid", "start", "samples")))
