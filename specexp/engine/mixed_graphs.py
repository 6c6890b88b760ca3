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
max_num_seqs - 1, the most verify rows that leave room for a chunk). The draft's half of a mixed step still runs
in parts (`DraftMixedSteps`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor, CudaGraphManager, graph_key
from specexp.engine.inputs import InputBuffers, uniform_dummy_inputs
from specexp.engine.scheduler import ScheduledBatch
from specexp.engine.verified import VerifiedBatch
from specexp.models.metadata import ForwardContext, Segment


def mixed_keys(verify_keys, max_num_seqs: int) -> tuple[tuple[int, int], ...]:
    """The (verify rows, v) keys joined graphs are captured for: each verify key's size, capped at
    max_num_seqs - 1 (a chunk takes the last row); none when max_num_seqs is 1."""
    return tuple(sorted({(min(size, max_num_seqs - 1), v) for size, v in verify_keys if max_num_seqs > 1}))


class MixedGraphs:
    """The target's joined graphs: per chunk count C (a prompt-graph count), a `CudaGraphManager` named
    `name_C` over `keys` (verify rows, v) at every key-length bucket. `managers`: {C: manager}, ascending
    (empty: joined graphs off)."""

    def __init__(self, name: str, chunk_tokens, keys: tuple[tuple[int, int], ...], device: torch.device,
                 seq_len_buckets: tuple[int, ...], enabled: bool, pool: tuple | None = None) -> None:
        sizes = sorted({size for size, _ in keys})
        counts = sorted(set(chunk_tokens)) if enabled and keys else []
        self.managers = {c: CudaGraphManager(f"{name}_{c}", sizes, 1, device, seq_len_buckets=seq_len_buckets,
                                             pool=pool, tokens_per_draft=1, capture_keys=keys)
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
        segments = [Segment(0, desc.num_tokens, attn, conv), Segment(desc.num_tokens, count, chunk_attn, chunk_conv)]
        self._mixed_graph_ctx[(count, *graph_key(desc))] = ForwardContext(
            attn=None, conv=None, kv_caches=self.kv_caches, conv_states=self.conv_states, segments=segments)

    def _mixed_graph(self, count: int, desc: BatchExecutionDescriptor) -> None:
        """The captured joined step: one segmented target forward over the verify rows' tokens and the chunk's,
        then the rejection sampler over all desc.num_reqs + 1 rows (the chunk's is the last)."""
        ctx = self._mixed_graph_ctx[(count, *graph_key(desc))]
        num_verify_tokens = desc.num_tokens
        input_ids = torch.cat((self.buffers.input_ids[:num_verify_tokens], self.chunk_buffers.input_ids[:count]))
        positions = torch.cat((self.buffers.positions[:num_verify_tokens], self.chunk_buffers.positions[:count]))
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
