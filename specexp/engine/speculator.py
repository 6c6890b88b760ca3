"""Autoregressive draft-model speculator (seed 000's `AutoRegressiveSpeculator`, standalone-draft flavour).

Each engine step, after the target verified its rows, the speculator proposes the step's k drafts per row
(0..K, `specexp.engine.depth`; K sizes every buffer):

1. **Draft prefill** over a region of `q + 1` slots per row, where q is the row's target query length
   (v + 1 for a verify row carrying v drafts, a prompt chunk for a prefill row)::

       verify row, a drafts accepted:   [t_last, d_1 .. d_a, new, x .. x]      (q + 1 = v + 2 slots)
                                         \\_ accepted inputs _/  ^    ^ rejected slots (token 0), whose
                                                                 |      KV is overwritten later
                                        the target's newly sampled token (correction or bonus);
                                        draft token 0 is sampled from its hidden state
       prefill row:                     [p_s .. p_e, new]

   Positions run on from the row's first query position, so the region's shape never depends on how
   many drafts were accepted: the CPU builds it without reading anything back from the device; the
   accepted count enters only through device tensors (token ids, `last_token_indices`).
   An attention-only draft (`last_two_regions`, `engine.draft_prefill_region`) runs each verify row's region over
   its last two slots instead, the target input at num_valid - 1 and the new token (`draft_catch_up`): its decode
   steps already wrote the KV of the accepted drafts before d_k, so only those two can be missing. Two tokens a row
   at every v: one prefill graph a batch size serves every k.
2. **k - 1 draft decode steps**, one token per row, each advancing positions, seq_lens and slot mappings
   on the device (`advance_draft_positions`). With k = 0 the prefill still runs (the draft's KV and conv state
   follow the committed tokens) and its sample is never verified.

Confidence rule (`draft_confidence_threshold` > 0): `draft_lengths[r]` is the number of row r's drafts up to and
including its first one whose draft probability is below the threshold (transformers' rule: its stopping
criterion looks at the token just drafted), K when there is none. The row keeps drafting (a fused decode has a
fixed shape); the rejection sampler verifies only its first `draft_lengths[r]` drafts.

Hybrid (short-conv) drafts: the region is verified like a target spec row (conv window at
`num_accepted - 1`, all region inputs appended; prefill rows keep the new token as a one-column
lookahead), so the window the next step needs survives rejections with no copy. The decode steps run on
*scratch* conv slots seeded with the window ending at the new token, so they never disturb the real
state — the rollback vLLM 0.33 lacks for conv drafts.

CUDA graphs, specialised per k (vLLM's `specialize_spec_tokens`): a batch of verify rows of v drafts each gives a
uniform prefill (v + 2 tokens a row), replayed from the `draft_prefill` graph of (size, v); the k - 1 decode
steps update positions, seq_lens and slot mappings in place on the device, so the whole loop is captured as ONE
graph per (batch size, k), k >= 2 (`draft_decode`, FULL or eager — never piecewise). Which keys are captured
is the depth policy's (`depth.graph_keys`); a key left out runs eagerly and is counted. Inputs are written into
the persistent buffers eagerly before each replay. A batch of verify rows beside prompt chunks replays its
prefill as one joined graph (`specexp.engine.mixed_graphs`) or in parts, one graph each
(`specexp.engine.mixed_steps`), before the one decode graph.
"""

from __future__ import annotations

import dataclasses

import torch

from specexp.engine.cudagraph import (
    FULL,
    NONE,
    BatchExecutionDescriptor,
    CudaGraphManager,
    PromptGraphs,
    graph_key,
)
from specexp.engine.draft_advance import DRAFT_STEP_KERNELS, DraftStepKernels, prefill_regions
from specexp.engine.draft_catch_up import stage_last_two, takes_last_two
from specexp.engine.draft_decode_inputs import DraftDecodeInputs
from specexp.engine.draft_steady import StagedPrefill, advance_prefill, prefill_layout_key
from specexp.engine.inputs import (
    InputBuffers,
    StepInputsCPU,
    build_step_inputs,
    stride_rows,
    uniform_dummy_inputs,
)
from specexp.engine.mixed_graphs import DraftMixedGraphs
from specexp.engine.mixed_steps import DraftMixedSteps
from specexp.engine.sampling import Argmax, RandomSource, logits_to_probs, sample_from_probs, torch_argmax
from specexp.engine.short_conv import ShortConvMetadataBuilder
from specexp.engine.verified import StagedRows, VerifiedBatch, is_uniform_verify
from specexp.models.caches import allocate_conv_state_stack, allocate_kv_caches
from specexp.models.metadata import ForwardContext


class AutoRegressiveSpeculator(DraftMixedSteps, DraftMixedGraphs, DraftDecodeInputs):
    """Owns the draft model, its caches and persistent input buffers; proposes k drafts per row.

    The draft shares the target's block ids (its own KV tensors, same block table). Conv slots: a request's
    slot s holds its real draft conv state, slot s + max_num_reqs its scratch state for decode steps.
    capture_sizes: row counts of the graphs (used when use_cuda_graphs). prefill_graph_keys, decode_graph_keys:
    the (size, v) / (size, k) keys to capture (`depth.graph_keys`; None: every size at K). graph_pool: the memory
    pool every draft graph captures into (the engine's shared pool, `cudagraph` module docstring); None = a pool
    per manager. confidence_threshold: the confidence rule's threshold (0 = off).
    """

    _staged_prefill: StagedPrefill | None = None  # the prefill staged last from the host (`draft_steady`)

    def __init__(
        self,
        draft_model: torch.nn.Module,
        *,
        num_speculative_tokens: int,
        max_num_reqs: int,
        max_num_tokens: int,
        num_blocks: int,
        block_size: int,
        max_blocks_per_req: int,
        temperature: float,
        device: torch.device,
        dtype: torch.dtype,
        generator: RandomSource,
        use_cuda_graphs: bool = False,
        capture_sizes: list[int] | None = None,
        seq_len_buckets: list[int] | None = None,
        prompt_graph_tokens: tuple[int, ...] = (),
        graph_pool: tuple | None = None,
        prefill_graph_keys: tuple[tuple[int, int], ...] | None = None,
        decode_graph_keys: tuple[tuple[int, int], ...] | None = None,
        confidence_threshold: float = 0.0,
        mixed_chunk_shapes: tuple[tuple[int, int], ...] = (),
        argmax: Argmax = torch_argmax,
        step_kernels: DraftStepKernels = DRAFT_STEP_KERNELS["torch"],
        prefill_region: str = "auto",
    ) -> None:
        self.model = draft_model
        self.argmax = argmax  # over the vocabulary, into the draft buffer's column (`sampling.ARGMAX_KERNELS`)
        self.advance = step_kernels.advance  # the rows one position further between decode steps (`draft_advance`)
        self.fill_prefill_ids = step_kernels.fill_prefill_ids  # the prefill regions' input ids from a verify
        self.place_last_two = step_kernels.place_last_two  # two-slot regions of verify rows (`draft_catch_up`)
        self.k = num_speculative_tokens
        self.max_num_reqs = max_num_reqs
        self.block_size = block_size
        self.temperature = temperature
        self.device = device
        # Host-side inputs in page-locked memory: staged while the verify still runs (inputs.build_step_inputs).
        self.pin_memory = torch.device(device).type == "cuda"
        self.generator = generator
        self.max_graph_seq_len = max_blocks_per_req * block_size
        self.kv_caches = allocate_kv_caches(draft_model, num_blocks, block_size, device, dtype)
        # Region of k+2 slots = a spec query of k+1 "drafts" for the conv builder.
        self.conv_state_stack = allocate_conv_state_stack(draft_model, 2 * max_num_reqs + 1, self.k + 1, device,
                                                          dtype)
        self.conv_states = [] if self.conv_state_stack is None else list(self.conv_state_stack.unbind(0))
        self.conv_width = getattr(draft_model.config, "conv_L_cache", 0) or 0
        # Uniform verify rows' prefill over two slots a row, whatever their v (`draft_catch_up`).
        self.last_two_regions = takes_last_two(prefill_region, bool(self.conv_states))
        builder = dict(use_full_cuda_graph=use_cuda_graphs, max_num_seqs=max_num_reqs, max_capture_size=None,
                       device=device)
        self.prefill_conv_builder = ShortConvMetadataBuilder(num_spec_tokens=self.k + 1, **builder)
        # Decode steps are 1-token spec rows (0 drafts, 1 accepted) on the scratch slots: the spec path is
        # the one with persistent buffers for graph replay.
        self.decode_conv_builder = ShortConvMetadataBuilder(num_spec_tokens=0, **builder)
        self.prefill_buffers = InputBuffers(max_num_reqs, max_num_tokens + max_num_reqs, max_blocks_per_req, device)
        self.decode_buffers = InputBuffers(max_num_reqs, max_num_reqs, max_blocks_per_req, device)
        self.decode_writes = torch.zeros(max_num_reqs, dtype=torch.bool, device=device)
        # A decode step's rows hold one token each, padding included: these two never change.
        self.decode_buffers.query_start_loc.copy_(torch.arange(max_num_reqs + 1, dtype=torch.int32))
        self.decode_buffers.token_req_indices.copy_(torch.arange(max_num_reqs))
        self.draft_tokens = torch.zeros(max_num_reqs, self.k, dtype=torch.int64, device=device)
        vocab = draft_model.config.vocab_size
        self.draft_probs = (
            torch.zeros(max_num_reqs, self.k, vocab, dtype=torch.float32, device=device) if temperature > 0 else None
        )
        self.last_token_indices = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        # Two-slot regions' per-row facts for the decode steps: start position, num_valid, samples (all 1).
        self.last_two_rows = torch.ones(3, max_num_reqs, dtype=torch.int64, device=device)
        self.last_two_layout: tuple | None = None  # (padded rows, rows, prefill buffers' version) loaded last
        self.confidence_threshold = confidence_threshold
        # Per row of the last proposal: its drafts up to its first below the threshold (K: none below).
        self.draft_lengths = torch.full((max_num_reqs,), self.k, dtype=torch.int64, device=device)
        sizes = capture_sizes or [max_num_reqs]
        buckets = tuple(seq_len_buckets or [self.max_graph_seq_len])
        if prefill_graph_keys is None:
            prefill_graph_keys = tuple((size, self.k) for size in sizes)
        if decode_graph_keys is None:
            decode_graph_keys = tuple((size, self.k) for size in sizes if self.k >= 2)
        # Verify rows of v drafts: regions of v + 2 slots (two slots, at every v, with last_two_regions: one graph
        # a size for every k); decode: one token a row, k - 1 steps.
        if self.last_two_regions:
            self.prefill_graphs = CudaGraphManager("draft_prefill", sorted({size for size, _ in prefill_graph_keys}),
                                                   2, device, enabled=use_cuda_graphs, seq_len_buckets=buckets,
                                                   pool=graph_pool)
        else:
            self.prefill_graphs = CudaGraphManager("draft_prefill", sizes, 2, device, enabled=use_cuda_graphs,
                                                   seq_len_buckets=buckets, pool=graph_pool, tokens_per_draft=1,
                                                   capture_keys=prefill_graph_keys)
        self.decode_graphs = CudaGraphManager("draft_decode", sizes, 1, device,
                                              enabled=use_cuda_graphs and bool(decode_graph_keys),
                                              seq_len_buckets=buckets, pool=graph_pool,
                                              capture_keys=decode_graph_keys)
        # A lone prompt chunk's region (its tokens + the sampled one), one manager per slot count: as the target's
        # prompt-prefill graphs (engine.cudagraph_prefill_tokens).
        self.prompt_graphs = PromptGraphs("draft_prompt_prefill", prompt_graph_tokens if use_cuda_graphs else (),
                                          device, buckets, pool=graph_pool)
        # The chunks' regions beside the verify rows' in one graph (`mixed_graphs`; engine.cudagraph_mixed=joined).
        self._init_mixed_graphs(prefill_graph_keys, mixed_chunk_shapes, buckets, graph_pool,
                                use_cuda_graphs and bool(mixed_chunk_shapes))
        # Forward contexts (views of the persistent buffers) of the captured graphs: the verify rows' prefill
        # and the decode graphs by (rows, k, key-length bucket), the prompt regions' by (slots, key-length
        # bucket); kept apart, as a one-row region of v + 2 slots has a verify-row graph's shape.
        self._prefill_graph_ctx: dict[tuple[int, int, int], ForwardContext] = {}
        self._prompt_graph_ctx: dict[tuple[int, int], ForwardContext] = {}
        self._decode_graph_ctx: dict[tuple[int, int, int], ForwardContext] = {}
        self._prefill_ctx: ForwardContext | None = None
        self._decode_ctx: ForwardContext | None = None

    @property
    def advance_draft_positions(self) -> bool:
        """Each draft step writes a new KV position (true for a standalone draft model)."""
        return True

    def persistent_buffer_bytes(self) -> int:
        tensors = [self.draft_tokens, self.last_token_indices, self.decode_writes, self.draft_lengths,
                   self.last_two_rows]
        if self.draft_probs is not None:
            tensors.append(self.draft_probs)
        own = sum(t.numel() * t.element_size() for t in tensors)
        return (own + self.prefill_buffers.nbytes() + self.decode_buffers.nbytes()
                + self.chunk_prefill_buffers.nbytes())

    # Hooks bracketing prefill and the multi-step decode (eager and at capture).
    def on_prefill_begin(self, num_reqs: int) -> None: ...
    def on_prefill_end(self, num_reqs: int) -> None: ...
    def on_multi_step_decode_begin(self, num_reqs: int) -> None: ...
    def on_multi_step_decode_end(self, num_reqs: int) -> None: ...

    def _ctx(self, attn, conv) -> ForwardContext:
        return ForwardContext(attn=attn, conv=conv, kv_caches=self.kv_caches, conv_states=self.conv_states)

    # ------------------------------------------------------------------ capture
    def capture(self, progress=None) -> None:
        """Capture the draft prefill graphs, then the fused multi-step decode graphs, for every key.

        Capture runs on inert dummy batches (slots -1, NULL conv slots): no request state is touched."""
        self.last_token_indices.zero_()
        self.on_prefill_begin(self.max_num_reqs)
        self.prefill_graphs.capture(self._prefill, self._prepare_prefill_capture, progress)
        self.prompt_graphs.capture(self._prefill, self._prepare_prompt_capture, progress)
        self.mixed_graphs.capture(self._mixed_graph, self._prepare_mixed_capture, progress)
        self.on_prefill_end(self.max_num_reqs)
        if not self.decode_graphs.keys:
            return
        self.on_multi_step_decode_begin(self.max_num_reqs)
        self.decode_graphs.capture(self._fused_multi_step_decode, self._prepare_decode_capture, progress)
        self.on_multi_step_decode_end(self.max_num_reqs)

    def _prepare_prefill_capture(self, desc: BatchExecutionDescriptor) -> None:
        num_reqs, num_tokens = desc.num_reqs, desc.num_tokens
        region = desc.num_speculative_tokens + 2
        cpu = uniform_dummy_inputs(num_reqs, region, self.prefill_buffers.block_table.shape[1])
        self.prefill_buffers.load(cpu)
        self.last_token_indices[:num_reqs].copy_(cpu.query_start_loc[:-1].to(self.device))
        attn = self.prefill_buffers.attention_metadata(num_reqs, num_tokens, desc.max_seq_len, region, num_tokens)
        conv = None
        if self.conv_states:
            conv = self.prefill_conv_builder.build_for_cudagraph_capture(num_reqs=num_reqs, num_tokens=num_tokens,
                                                                         query_len=region)
        self._prefill_graph_ctx[graph_key(desc)] = self._prefill_ctx = self._ctx(attn, conv)

    def _prepare_prompt_capture(self, desc: BatchExecutionDescriptor) -> None:
        """An inert one-row region of desc.num_tokens slots (`InputBuffers.load_inert_prompt`)."""
        attn = self.prefill_buffers.load_inert_prompt(desc.num_tokens, desc.max_seq_len)
        self.last_token_indices[:1].zero_()
        conv = None
        if self.conv_states:  # the region's last slot is the sampled token, not yet committed: lookahead 1
            conv = self.prefill_conv_builder.build_for_prompt_capture(num_tokens=desc.num_tokens, state_lookahead=1)
        self._prompt_graph_ctx[(desc.num_tokens, desc.max_seq_len)] = self._prefill_ctx = self._ctx(attn, conv)

    def _prepare_decode_capture(self, desc: BatchExecutionDescriptor) -> None:
        num_reqs = desc.num_reqs
        self._load_decode_rows(num_reqs, num_reqs)
        attn = self.decode_buffers.attention_metadata(num_reqs, num_reqs, desc.max_seq_len, 1, num_reqs)
        conv = None
        if self.conv_states:
            conv = self.decode_conv_builder.build_for_cudagraph_capture(num_reqs=num_reqs, num_tokens=num_reqs)
        self._decode_graph_ctx[graph_key(desc)] = self._decode_ctx = self._ctx(attn, conv)

    def run_inert_decode(self, num_reqs: int, bucket: int, k: int = 2) -> None:
        """The draft's decode phase for k >= 2 drafts (its k - 1 fused decode steps) on num_reqs inert rows (as at
        capture), replayed when its (size, k) graph was captured, else eager: what the engine times as
        t_draft(k) (`measure_step_costs`)."""
        desc = self.decode_graphs.lookup(num_reqs, bucket, k)
        desc = desc or BatchExecutionDescriptor(num_reqs, num_reqs, NONE, bucket, k)
        self._prepare_decode_capture(desc)
        self.decode_graphs.execute(desc, self._fused_multi_step_decode)

    # ------------------------------------------------------------------ propose
    def propose(self, batch: VerifiedBatch, k: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft k tokens per row (the step's k, 0..K; None = K). Returns (draft_tokens int64[R, K], draft_probs
        fp32[R, K, V] or None; columns k.. are stale), views of persistent buffers valid until the next call (the
        engine's next step gathers its drafts from `draft_tokens` on the device before it calls again)."""
        k = self.k if k is None else k
        num_reqs = batch.query_lens.numel()
        uniform = is_uniform_verify(batch)
        # Keys of the longest row: the whole q+1-slot region (prefill); + k-1 decode steps past its new token.
        max_region_end = int((batch.start_positions + batch.query_lens).max()) + 1
        parts = None if uniform else self._prefill_parts(batch)  # a mixed batch: replayed in parts
        if parts is not None:
            rows = self._prefill_in_parts(batch, parts)
        else:
            prefill_desc, graphs = self._dispatch_prefill(batch, uniform, max_region_end)
            rows = self._prepare_prefill_inputs(batch, prefill_desc)
            self.on_prefill_begin(num_reqs)
            graphs.execute(prefill_desc, self._prefill)
            self.on_prefill_end(num_reqs)
        if k > 1:
            decode_desc = self.decode_graphs.dispatch(num_reqs, num_reqs, uniform=True,
                                                      max_seq_len=max_region_end + k - 1, k=k)
            self._prepare_decode_inputs(batch, rows, decode_desc)
            self.on_multi_step_decode_begin(num_reqs)
            self.decode_graphs.execute(decode_desc, self._fused_multi_step_decode)
            self.on_multi_step_decode_end(num_reqs)
        probs = self.draft_probs[:num_reqs] if self.draft_probs is not None else None
        return self.draft_tokens[:num_reqs], probs

    def _dispatch_prefill(self, batch: VerifiedBatch, uniform: bool, max_region_end: int
                          ) -> tuple[BatchExecutionDescriptor, CudaGraphManager]:
        """How the draft's prefill runs, and the manager that counts it: a lone prompt chunk's region replays
        the smallest prompt graph that holds it; uniform verify rows the prefill graphs; anything else eagerly."""
        num_reqs = batch.query_lens.numel()
        num_slots = int(batch.query_lens.sum()) + num_reqs
        if num_reqs == 1 and not bool(batch.is_spec[0]):
            prompt = self.prompt_graphs.dispatch(num_slots, max_region_end)
            if prompt is not None:
                return prompt
        if uniform and self.last_two_regions:  # verify rows, two slots each (`draft_catch_up`)
            return self.prefill_graphs.dispatch(num_reqs, 2 * num_reqs, True, max_region_end), self.prefill_graphs
        v = int(batch.query_lens[0]) - 1  # drafts each verify row carried (uniform batches)
        return self.prefill_graphs.dispatch(num_reqs, num_slots, uniform, max_region_end, k=v), self.prefill_graphs

    def _prepare_prefill_inputs(self, batch: VerifiedBatch, desc: BatchExecutionDescriptor,
                                buffers: InputBuffers | None = None, row_offset: int = 0,
                                token_offset: int = 0, row_stride: int | None = None) -> StagedRows:
        """Fill the prefill buffers with the q+1-slot regions (padded to desc); returns the rows' device facts
        the decode steps need (num_valid: the leading region slots that hold committed target inputs).
        buffers (None: `prefill_buffers`), row_offset, token_offset: as the target's staging, for a segment of a
        joined forward (`specexp.engine.mixed_graphs`): where its rows' lines of `last_token_indices` start
        and where its first slot sits in the forward; row_stride: prompt regions laid out in rows of that many
        slots (a joined graph's chunk segment)."""
        main = buffers is None and row_offset == token_offset == 0 and row_stride is None
        # two slots a row where desc was dispatched for them (a joined mixed graph's verify segment keeps v + 2)
        if main and self.last_two_regions and is_uniform_verify(batch) and desc.num_tokens == 2 * desc.num_reqs:
            rows = stage_last_two(self, batch, desc)
            n = rows.start.numel()
            self._prefill_ctx = (self._prefill_graph_ctx.get(graph_key(desc)) if desc.cg_mode == FULL else self._ctx(
                self.prefill_buffers.attention_metadata(n, 2 * n, desc.max_seq_len, 2, 2 * n), None))
            return rows
        key = prefill_layout_key(batch, desc, bool(self.conv_states)) if main else None
        last = self._staged_prefill  # a steady step's regions follow from the target's (`draft_steady`)
        if (key is not None and batch.target_buffers is not None and last is not None and last.key == key
                and last.version == self.prefill_buffers.version):
            self._prefill_ctx = self._prefill_graph_ctx.get(graph_key(desc))
            return advance_prefill(self, batch, desc, last)
        num_reqs = batch.query_lens.numel()
        query_lens = batch.query_lens.tolist()
        # Region r: q_r + 1 slots at positions start_r .. start_r + q_r (input ids filled on the device below).
        regions = ([[0] * (q + 1) for q in query_lens], batch.start_positions.tolist(), batch.block_table.tolist(),
                   self.block_size, self.prefill_buffers.block_table.shape[1])
        if row_stride is None:
            cpu = build_step_inputs(*regions, desc.num_reqs, desc.num_tokens, pin_memory=self.pin_memory)
        else:
            cpu = stride_rows(build_step_inputs(*regions), row_stride, desc.num_reqs, pin_memory=self.pin_memory)
        # Per region slot: its row, its index in the region, and the target input it copies (src).
        region_row, region_i, src, region_start = prefill_regions(query_lens, row_stride)
        buffers = self.prefill_buffers if buffers is None else buffers
        buffers.load(cpu, desc.num_reqs, desc.num_tokens)
        dev = self.device
        # One host-to-device copy: those three per region slot, then per row its query length, spec flag,
        # region start, start position and samples flag (the last two for the decode steps).
        n = len(region_row)
        staged = torch.tensor(region_row + region_i + src + query_lens + batch.is_spec.tolist() + region_start
                              + batch.start_positions.tolist() + batch.samples.tolist(), dtype=torch.int64,
                              pin_memory=self.pin_memory)
        staged = staged.to(dev, non_blocking=True)
        start_d, samples_d = staged[3 * n + 3 * num_reqs :].view(2, num_reqs).unbind(0)
        # Verify rows keep their accepted inputs (t_last + accepted drafts = num_sampled), then the new token;
        # prefill rows all their inputs (`draft_advance.fill_prefill_ids`). Slot i of region r at its region
        # start + i (r * row_stride + i in a joined graph's chunk segment).
        rows = self.last_token_indices[row_offset : row_offset + desc.num_reqs]
        num_valid = self.fill_prefill_ids(staged, n, num_reqs, batch.num_sampled, batch.sampled,
                                          batch.target_input_ids, buffers.input_ids, rows, token_offset)
        staged_rows = StagedRows(num_valid, start_d, samples_d)
        if row_stride is not None:  # a joined graph's chunk segment: point its persistent conv buffers at the regions
            if self.conv_states:
                self.prefill_conv_builder.load_prompt_rows(
                    query_lens=[q + 1 for q in query_lens], num_computed_tokens=batch.start_positions.tolist(),
                    state_indices=batch.conv_slots.tolist(), row_tokens=row_stride)
            return staged_rows
        # a prompt graph (prefill graphs hold verify rows; a joined graph's verify segment may hold none)
        if desc.cg_mode == FULL and num_reqs and not bool(batch.is_spec[0]):
            self._prefill_ctx = self._prompt_graph_ctx.get((desc.num_tokens, desc.max_seq_len))  # joined: unused
            if self.conv_states:  # point its persistent conv buffers at this region
                self.prefill_conv_builder.load_prompt_row(
                    query_len=query_lens[0] + 1, num_tokens_padded=desc.num_tokens,
                    num_computed_tokens=int(batch.start_positions[0]), state_index=int(batch.conv_slots[0]))
            return staged_rows
        if desc.cg_mode == FULL:
            self._prefill_ctx = self._prefill_graph_ctx.get(graph_key(desc))  # joined: unused
            if self.conv_states:  # refresh the persistent conv buffers the graph reads
                self._build_prefill_conv(batch, cpu, desc.num_reqs)
            self._staged_prefill = StagedPrefill(key, buffers.version, staged, n) if key is not None else None
            return staged_rows
        attn = buffers.attention_metadata(
            num_reqs, cpu.num_tokens, max_seq_len=desc.max_seq_len, max_query_len=cpu.max_query_len,
            num_actual_tokens=cpu.num_tokens,
        )
        conv = None
        if self.conv_states:
            conv = dataclasses.replace(self._build_prefill_conv(batch, cpu, None), non_spec_state_lookahead=1)
        self._prefill_ctx = self._ctx(attn, conv)
        return staged_rows

    def _build_prefill_conv(self, batch: VerifiedBatch, cpu: StepInputsCPU, num_reqs_padded: int | None):
        return self.prefill_conv_builder.build(
            query_start_loc_cpu=cpu.query_start_loc,
            num_computed_tokens_cpu=batch.start_positions.to(torch.int32),
            num_decode_draft_tokens_cpu=torch.where(batch.is_spec, batch.query_lens, -1).to(torch.int32),
            num_accepted_tokens_cpu=batch.num_accepted_prev.to(torch.int32),
            state_indices_cpu=batch.conv_slots.to(torch.int32),
            num_reqs_padded=num_reqs_padded,
        )

    def _sample_draft(self, logits: torch.Tensor, num_reqs: int, step: int) -> None:
        """Draft token `step` of each row from logits fp32[R, V]: argmax when greedy, else a sample from
        softmax(logits / T), whose probabilities the rejection sampler needs. With the confidence rule on, the
        token's draft probability updates the row's `draft_lengths`."""
        tokens = self.draft_tokens[:num_reqs, step]  # written in place by the argmax
        if self.draft_probs is None:
            self.argmax(logits, tokens)
            if self.confidence_threshold > 0:
                self._update_draft_lengths(torch.softmax(logits, dim=-1).amax(dim=-1), num_reqs, step)
            return
        probs = logits_to_probs(logits, self.temperature)
        self.draft_probs[:num_reqs, step] = probs
        sample_from_probs(probs, self.generator, self.argmax, tokens)
        if self.confidence_threshold > 0:
            self._update_draft_lengths(probs.gather(1, tokens.unsqueeze(1)).squeeze(1), num_reqs, step)

    def _update_draft_lengths(self, token_probs: torch.Tensor, num_reqs: int, step: int) -> None:
        """draft_lengths[r] = step + 1 when draft `step` of row r is its first below the threshold (token_probs:
        fp32[R], each drafted token's draft probability); K until then. On the device, capturable."""
        low = token_probs < self.confidence_threshold
        lengths = self.draft_lengths[:num_reqs]
        if step == 0:
            lengths.copy_(torch.where(low, 1, self.k))
        else:
            lengths.copy_(torch.where(low & (lengths == self.k), step + 1, lengths))

    def _prefill(self, desc: BatchExecutionDescriptor) -> None:
        """Run the draft over all regions and sample draft token 0 at each row's new token."""
        buffers = self.prefill_buffers
        num_tokens = desc.num_tokens
        hidden = self.model(buffers.input_ids[:num_tokens], buffers.positions[:num_tokens], self._prefill_ctx)
        logits = self.model.compute_logits(hidden[self.last_token_indices[: desc.num_reqs]])
        self._sample_draft(logits, desc.num_reqs, 0)

    def _fused_multi_step_decode(self, desc: BatchExecutionDescriptor) -> None:
        """All k-1 decode steps (k = desc.num_speculative_tokens); every per-step update happens in place on the
        device, so this whole loop is capturable as one graph per (size, k)."""
        for step in range(1, desc.num_speculative_tokens):
            self._decode(desc.num_reqs, step)

    def _decode(self, num_reqs: int, step: int) -> None:
        """Draft step `step` (1..k-1): feed draft token step-1 one position further; sample draft `step`."""
        buffers = self.decode_buffers
        positions = buffers.positions[:num_reqs]
        self.advance(self.draft_tokens, step, buffers.input_ids[:num_reqs], positions, buffers.seq_lens[:num_reqs],
                     buffers.block_table[:num_reqs], self.decode_writes[:num_reqs], buffers.slot_mapping[:num_reqs],
                     self.block_size)
        hidden = self.model(buffers.input_ids[:num_reqs], positions, self._decode_ctx)
        self._sample_draft(self.model.compute_logits(hidden), num_reqs, step)
