"""The native engine: continuous batching with draft-model speculation, one `step()` at a time.

A step:  schedule (CPU) -> target forward over all rows' queries (verify + prefill chunks) ->
rejection sampling (device) -> ONE device-to-host read (the emitted tokens and their counts) -> draft proposal
(device) -> bookkeeping on the CPU. Nothing else is read back. A step that replays a verify graph samples inside
the graph (its inputs in `row_inputs`, its output in `step_out`): launched one by one, the sampler's ~20 small
ops cost the host 0.3-0.4 ms a step on the H200, a third of a batch-1 verify. vLLM's model runner launches its
sampler after the graph.

The read-back is ordered before the draft and waited for after it is queued: while the draft runs on the device,
the host commits the step, schedules the next one and stages its inputs, so the next verify follows the draft
with no gap for the host's work. The drafts never leave the device: the next step gathers them from the
speculator's draft buffer into its input ids and the rejection sampler's inputs. Each step's phase times are
read one step late, when its draft has finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specexp.engine.cache_pool import IdPool, blocks_needed
from specexp.engine.config import EngineConfig, EngineConfigError, SamplingConfig, SpeculatorConfig
from specexp.engine.cudagraph import (
    FULL,
    BatchExecutionDescriptor,
    CudaGraphManager,
    PromptGraphs,
    default_capture_sizes,
    default_seq_len_buckets,
    free_device_bytes,
    frozen_gc,
)
from specexp.engine.inputs import InputBuffers, build_step_inputs, uniform_dummy_inputs
from specexp.engine.rejection_sampler import RejectionSampler
from specexp.engine.request import Request
from specexp.engine.scheduler import ScheduledBatch, Scheduler
from specexp.engine.short_conv import ShortConvMetadataBuilder
from specexp.engine.speculator import AutoRegressiveSpeculator, VerifiedBatch
from specexp.engine.timing import PhaseStamps, PhaseTimer
from specexp.models.attention import ATTENTION_KERNELS, use_attention_kernel
from specexp.models.caches import allocate_conv_states, allocate_kv_caches
from specexp.models.linear_ops import LINEAR_KERNELS, use_linear_ops
from specexp.models.metadata import ForwardContext
from specexp.models.norm_folding import fold_norm_weights
from specexp.models.pointwise import EAGER as EAGER_POINTWISE
from specexp.models.pointwise import compiled_pointwise_ops, use_pointwise_ops
from specexp.models.short_conv_ops import CONV_KERNELS, use_conv_kernel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class StepRecord:
    """One engine step (a row of steps.parquet). Times in milliseconds.

    The phases are device time between the step's marks (CUDA events; wall clock on CPU): schedule_ms from the
    step's start to its verify (the device waiting for the host's scheduling and staging; ~0 while the host
    stages ahead of a device still busy with the step before), verify_ms, sample_ms (rejection sampler; 0 when
    the step replays a verify graph, which samples too: verify_ms then includes it), draft_ms (the draft's
    prefill and decode steps). step_ms is the host's wall time in the step() call."""

    step: int
    num_reqs: int
    num_tokens: int
    num_prefill_tokens: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_output_tokens: int
    schedule_ms: float
    verify_ms: float
    sample_ms: float
    draft_ms: float
    step_ms: float


@dataclass
class InFlightStep:
    """A plain-decoding step queued but not read back yet (plain_decode_lookahead): its rows, where its
    read-back lands (`host`, once `done` has fired), and which rows were committed provisionally. Its emitted
    tokens stay in column 0 of the engine's `step_out` until the next step has gathered its input tokens."""

    batch: ScheduledBatch
    host: torch.Tensor
    done: torch.cuda.Event | None
    committed_rows: list[bool] = field(default_factory=list)


@dataclass
class EngineOutput:
    requests: list[Request]
    steps: list[StepRecord] = field(default_factory=list)
    total_s: float = 0.0
    persistent_buffer_bytes: int = 0
    graphs: dict | None = None  # capture/replay summary (None when the engine runs eager)


def check_pair(target: torch.nn.Module, draft: torch.nn.Module | None) -> None:
    """A draft must share the target's vocabulary."""
    if draft is None:
        return
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise EngineConfigError(
            f"draft vocab ({dv}) != target vocab ({tv}): a draft must share the target's tokenizer"
        )


class NativeEngine:
    """Serves a list of prompts with the target model, optionally speculating with a draft model.

    eos_token_ids: tokens that end a request (unless sampling.ignore_eos).
    """

    def __init__(
        self,
        target: torch.nn.Module,
        draft: torch.nn.Module | None,
        engine: EngineConfig,
        speculator: SpeculatorConfig,
        sampling: SamplingConfig,
        eos_token_ids: list[int] | None = None,
        emulate_graphs_on_cpu: bool = False,
    ) -> None:
        engine.validate()
        speculator.validate(engine.max_model_len)
        sampling.validate()
        self.k = speculator.num_speculative_tokens if draft is not None else 0
        if self.k > 0:
            check_pair(target, draft)
        self.cfg, self.spec_cfg, self.sampling = engine, speculator, sampling
        self.device = torch.device(engine.device)
        # Host-side step inputs in page-locked memory: a copy from pageable memory may wait for the stream to
        # drain, which would hold the host until the draft still running on the device has finished.
        self.pin_memory = self.device.type == "cuda"
        self.dtype = DTYPES[engine.dtype]
        self.target = target
        # Every model of this engine calls the fused (compiled) pointwise ops, or the eager ones, as configured
        # (set on the modules: a model shared by two engines follows the last one built).
        ops = compiled_pointwise_ops() if engine.compile_pointwise else EAGER_POINTWISE
        for model in (target, draft) if self.k > 0 else (target,):
            if engine.fold_norm_weights:
                fold_norm_weights(model)
            use_pointwise_ops(model, ops)
            use_linear_ops(model, LINEAR_KERNELS[engine.linear_kernel])
            use_attention_kernel(model, ATTENTION_KERNELS[engine.attention_kernel])
            use_conv_kernel(model, CONV_KERNELS[engine.conv_kernel])
        self.eos_token_ids = set(eos_token_ids or [])
        # On CUDA, sampling uses the default generator: CUDA graphs capture its Philox state natively.
        self.generator: torch.Generator | None = None
        if self.device.type == "cuda":
            torch.cuda.manual_seed(engine.seed)
        else:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(engine.seed)
        lookahead = 2 * self.k + 1 if self.k else 0
        self.max_blocks_per_req = blocks_needed(engine.max_model_len + lookahead, engine.block_size)
        num_blocks = engine.num_kv_blocks or engine.max_num_seqs * self.max_blocks_per_req
        self.block_pool = IdPool(num_blocks)
        self.slot_pool = IdPool(engine.max_num_seqs)
        self.scheduler = Scheduler(
            max_num_seqs=engine.max_num_seqs, max_model_len=engine.max_model_len,
            token_budget=engine.token_budget, block_size=engine.block_size, num_spec_tokens=self.k,
            block_pool=self.block_pool, slot_pool=self.slot_pool,
        )
        self.max_num_tokens = self.scheduler.token_budget
        # +1: block id / conv slot 0 is the NULL entry.
        self.kv_caches = allocate_kv_caches(target, num_blocks + 1, engine.block_size, self.device, self.dtype)
        self.conv_states = allocate_conv_states(target, engine.max_num_seqs + 1, self.k, self.device, self.dtype)
        # emulate_graphs_on_cpu (tests): FULL mode on a CPU pads and replays through the persistent buffers
        # exactly as graphs do, without capturing anything.
        self.use_graphs = engine.cudagraph_mode == FULL and (self.device.type == "cuda" or emulate_graphs_on_cpu)
        self.capture_sizes = sorted(
            s for s in (engine.cudagraph_capture_sizes or default_capture_sizes(engine.max_num_seqs))
            if s <= engine.max_num_seqs
        ) or [engine.max_num_seqs]
        # Key-length buckets: every bucket above the longest reachable row is that longest row.
        max_graph_seq_len = self.max_blocks_per_req * engine.block_size
        self.seq_len_buckets = sorted({
            min(b, max_graph_seq_len)
            for b in (engine.cudagraph_seq_len_buckets or default_seq_len_buckets(max_graph_seq_len, engine.block_size))
        } | {max_graph_seq_len})
        self.conv_builder = ShortConvMetadataBuilder(
            num_spec_tokens=self.k, use_full_cuda_graph=self.use_graphs, max_num_seqs=engine.max_num_seqs,
            max_capture_size=None, device=self.device,
        )
        self.buffers = InputBuffers(engine.max_num_seqs, self.max_num_tokens, self.max_blocks_per_req, self.device)
        # One memory pool for every graph, target and draft (engine.cudagraph_shared_pool); None: a pool each.
        self.graph_pool = (torch.cuda.graph_pool_handle()
                           if self.use_graphs and self.device.type == "cuda" and engine.cudagraph_shared_pool else None)
        # Target verify graphs: uniform batches of k+1 tokens a row (1 without speculation).
        self.verify_graphs = CudaGraphManager("target_verify", self.capture_sizes, self.k + 1, self.device,
                                              enabled=self.use_graphs, seq_len_buckets=tuple(self.seq_len_buckets),
                                              pool=self.graph_pool)
        # Per row of a step, what the rejection sampler reads (filled by one host-to-device copy, padding rows
        # zero): logits rows [k+1], the row of the speculator's draft buffer holding its drafts, the count of
        # drafts it may accept, whether it samples, its conv slot (which also indexes its draft probs).
        self.row_inputs = torch.zeros(engine.max_num_seqs, self.k + 5, dtype=torch.int64, device=self.device)
        # What the sampler emits per row, as read back: tokens [k+1] (left-aligned, -1 after) and their count.
        self.step_out = torch.zeros(engine.max_num_seqs, self.k + 2, dtype=torch.int64, device=self.device)
        self._verify_graph_ctx: dict[tuple[int, int], ForwardContext] = {}  # by (rows, key-length bucket)
        # One-request prompt prefills, one manager per token count (a "batch" of one row of that many tokens).
        prefill_tokens = engine.cudagraph_prefill_tokens if self.use_graphs else ()
        self.prefill_graphs = PromptGraphs("target_prefill", prefill_tokens, self.device,
                                           tuple(self.seq_len_buckets), pool=self.graph_pool)
        self._prefill_graph_ctx: dict[tuple[int, int], ForwardContext] = {}  # by (tokens, key-length bucket)
        self.rejection = RejectionSampler(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            mode=speculator.rejection, synthetic_acceptance_rate=speculator.synthetic_acceptance_rate,
            generator=self.generator,
        )
        self.speculator: AutoRegressiveSpeculator | None = None
        self.req_draft_probs: torch.Tensor | None = None
        if self.k > 0:
            self.speculator = AutoRegressiveSpeculator(
                draft, num_speculative_tokens=self.k, max_num_reqs=engine.max_num_seqs,
                max_num_tokens=self.max_num_tokens, num_blocks=num_blocks + 1, block_size=engine.block_size,
                max_blocks_per_req=self.max_blocks_per_req, temperature=sampling.temperature,
                device=self.device, dtype=self.dtype, generator=self.generator,
                use_cuda_graphs=self.use_graphs and speculator.cudagraph_mode == FULL,
                capture_sizes=self.capture_sizes, seq_len_buckets=self.seq_len_buckets, graph_pool=self.graph_pool,
                # a prompt chunk's draft region is its tokens + the sampled one
                prompt_graph_tokens=tuple(n + 1 for n in self.prefill_graphs.managers),
            )
            if not sampling.greedy:
                # Draft probabilities of each request's pending drafts, by conv slot (a request's stable id).
                self.req_draft_probs = torch.zeros(
                    engine.max_num_seqs + 1, self.k, target.config.vocab_size, device=self.device
                )
        self.timer = PhaseTimer(self.device)
        # The steps' read-backs land here (page-locked on a GPU, so the copy is asynchronous): sampled tokens [k+1]
        # and their count per row. Two buffers and events, used by alternate steps: with plain_decode_lookahead a
        # step's read-back is queued before the last one is consumed.
        self.host_out = [torch.zeros(engine.max_num_seqs, self.k + 2, dtype=torch.int64, pin_memory=self.pin_memory)
                         for _ in range(2)]
        self.readback_done = [torch.cuda.Event() for _ in range(2)] if self.device.type == "cuda" else None
        self._read_back_slot = 0
        # Plain decoding (k = 0) queues each step before the last one is read back.
        self.lookahead = self.k == 0 and engine.plain_decode_lookahead
        self._in_flight: InFlightStep | None = None
        # The last step's record, whose phase times are read when its draft has finished (one step late).
        self._pending: tuple[StepRecord, PhaseStamps] | None = None
        self.steps: list[StepRecord] = []
        self._t0 = 0.0
        self.graph_capture: dict | None = None
        if self.use_graphs:
            self.capture()
            if engine.compile_pointwise and self.device.type == "cuda":
                # The graphs hold the fused kernels. Steps that run eagerly (prefills, mixed batches) call the
                # plain ops: a compiled function's Python dispatch (guards, wrappers) costs the host more than
                # the few kernel launches it saves, and an eager step is bound by the host.
                for model in (target, draft) if self.k > 0 else (target,):
                    use_pointwise_ops(model, EAGER_POINTWISE)

    # ------------------------------------------------------------------ CUDA graphs
    @torch.inference_mode()
    def capture(self, progress=None) -> None:
        """Capture every graph once, at start-up: target verify, draft prefill, draft decode.

        Records the free-memory delta of the whole capture (vLLM's figure) and each manager's per-size costs.
        progress(label) is called after each graph; None on a GPU = a progress bar on stderr."""
        cuda = self.device.type == "cuda"
        bar = None
        if progress is None and cuda:
            from tqdm.auto import tqdm

            total = sum(m.num_graphs_to_capture for m in self.graph_managers())
            bar = tqdm(total=total, desc="capturing CUDA graphs", unit="graph", leave=False)

            def progress(label: str) -> None:
                bar.set_postfix_str(label, refresh=False)
                bar.update(1)

        with frozen_gc():
            free_before = free_device_bytes(self.device) if cuda else None
            start = time.perf_counter()
            self.verify_graphs.capture(self._verify_graph, self._prepare_verify_capture, progress)
            self.prefill_graphs.capture(self._prefill_graph, self._prepare_prefill_capture, progress)
            if self.speculator is not None:
                self.speculator.capture(progress)
            capture_s = time.perf_counter() - start
        if bar is not None:
            bar.close()
        self.graph_capture = {
            "graph_capture_bytes": free_before - free_device_bytes(self.device) if cuda else None,
            "graph_capture_s": capture_s if cuda else None,
        }

    def graph_managers(self) -> list[CudaGraphManager]:
        managers = [self.verify_graphs, *self.prefill_graphs.managers.values()]
        if self.speculator is not None:
            managers += [self.speculator.prefill_graphs, *self.speculator.prompt_graphs.managers.values(),
                         self.speculator.decode_graphs]
        return managers

    def graph_summary(self) -> dict | None:
        """Capture totals, per (manager, size) costs, and replayed vs eager step counts."""
        if self.graph_capture is None:
            return None
        return {**self.graph_capture, "managers": {m.name: m.summary() for m in self.graph_managers()}}

    def _prepare_verify_capture(self, desc: BatchExecutionDescriptor) -> None:
        cpu = uniform_dummy_inputs(desc.num_reqs, self.k + 1, self.max_blocks_per_req)
        self.buffers.load(cpu)
        attn = self.buffers.attention_metadata(desc.num_reqs, desc.num_tokens, desc.max_seq_len, self.k + 1,
                                               desc.num_tokens)
        conv = None
        if self.conv_states:
            conv = self.conv_builder.build_for_cudagraph_capture(num_reqs=desc.num_reqs, num_tokens=desc.num_tokens)
        self._verify_graph_ctx[(desc.num_reqs, desc.max_seq_len)] = ForwardContext(
            attn=attn, conv=conv, kv_caches=self.kv_caches, conv_states=self.conv_states)

    def _verify_graph(self, desc: BatchExecutionDescriptor) -> None:
        """The captured step: the target scores every token of a uniform batch, and the rejection sampler turns
        the logits into `step_out` (one graph, so sampling costs the host nothing)."""
        num_tokens = desc.num_tokens
        hidden = self.target(self.buffers.input_ids[:num_tokens], self.buffers.positions[:num_tokens],
                             self._verify_graph_ctx[(desc.num_reqs, desc.max_seq_len)])
        logits = self.target.compute_logits(hidden).view(desc.num_reqs, self.k + 1, -1)
        self._sample(logits, desc.num_reqs)

    def _prepare_prefill_capture(self, desc: BatchExecutionDescriptor) -> None:
        """An inert one-row prompt of desc.num_tokens tokens (`InputBuffers.load_inert_prompt`)."""
        attn = self.buffers.load_inert_prompt(desc.num_tokens, desc.max_seq_len)
        conv = self.conv_builder.build_for_prompt_capture(num_tokens=desc.num_tokens) if self.conv_states else None
        self._prefill_graph_ctx[(desc.num_tokens, desc.max_seq_len)] = ForwardContext(
            attn=attn, conv=conv, kv_caches=self.kv_caches, conv_states=self.conv_states)

    def _prefill_graph(self, desc: BatchExecutionDescriptor) -> None:
        """The captured prompt prefill of one row (padded to desc.num_tokens): the target's forward, the logits
        at the row's scoring position and the sampler, as an eager step runs them."""
        ctx = self._prefill_graph_ctx[(desc.num_tokens, desc.max_seq_len)]
        hidden = self.target(self.buffers.input_ids[: desc.num_tokens], self.buffers.positions[: desc.num_tokens],
                             ctx)
        self._sample(self._logits_at_scoring_rows(hidden, 1), 1)

    def _sample(self, logits: torch.Tensor, num_rows: int) -> None:
        """Rejection-sample rows [0, num_rows) from logits fp32[num_rows, k+1, V] and the rows' inputs in
        `row_inputs` (drafts gathered from the speculator's draft buffer); writes `step_out[:num_rows]`."""
        k, rows = self.k, self.row_inputs[:num_rows]
        drafts = self.speculator.draft_tokens[rows[:, k + 1]] if self.speculator is not None else rows[:, :0]
        draft_probs = self.req_draft_probs[rows[:, k + 4]] if self.req_draft_probs is not None else None
        verified = self.rejection(logits, drafts, rows[:, k + 2], draft_probs, rows[:, k + 3] != 0)
        self.step_out[:num_rows, : k + 1].copy_(verified.sampled)
        self.step_out[:num_rows, k + 1].copy_(verified.num_sampled)

    def persistent_buffer_bytes(self) -> int:
        total = self.buffers.nbytes() + sum(t.numel() * t.element_size() for t in (self.row_inputs, self.step_out))
        if self.speculator is not None:
            total += self.speculator.persistent_buffer_bytes()
        if self.req_draft_probs is not None:
            total += self.req_draft_probs.numel() * self.req_draft_probs.element_size()
        return total

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int | None = None,
                 on_step=None) -> EngineOutput:
        """Serve all prompts (arriving together) to completion. prompts: token ids per request."""
        max_new = max_new_tokens or self.sampling.max_new_tokens
        requests = [Request(i, list(p), max_new) for i, p in enumerate(prompts)]
        self.steps, self._pending, self._in_flight = [], None, None
        for request in requests:
            self.scheduler.add(request)
        self._t0 = time.perf_counter()
        while self.scheduler.has_work:
            timed = self.step()
            if timed is not None and on_step is not None:
                on_step(timed)
        timed = None
        if self._in_flight is not None:  # the last queued step's tokens (and the times of the step before)
            timed = self._commit_read_back(self._in_flight)
            self._in_flight = None
        for record in (timed, self.finish_timing()):
            if record is not None and on_step is not None:
                on_step(record)
        return EngineOutput(requests, list(self.steps), time.perf_counter() - self._t0,
                            self.persistent_buffer_bytes(), self.graph_summary())

    def finish_timing(self) -> StepRecord | None:
        """Read the phase times of the last step (waiting for its draft); returns its record, or None if every
        step's times are in."""
        if self._pending is None:
            return None
        record, stamps = self._pending
        self._pending = None
        phases = stamps.elapsed_ms()
        record.schedule_ms, record.verify_ms, record.sample_ms, record.draft_ms = (
            phases.get(name, 0.0) for name in ("schedule", "verify", "sample", "draft"))
        return record

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def step(self) -> StepRecord | None:
        """Run one step. Its record is appended to `steps` at once, with its phase times filled in one step
        late (the draft is still running when it returns); returns the previous step's record, now complete
        (None for the first step). `finish_timing()` completes the last one."""
        timer = self.timer
        t_start = time.perf_counter()
        timer.start("schedule")
        batch = self.scheduler.schedule()
        if not batch.rows:
            raise RuntimeError("scheduler produced an empty step while requests are waiting")
        desc, graphs = self._dispatch(batch)
        prep = self._prepare_target_inputs(batch, desc)
        timer.mark("verify")
        num_reqs = batch.num_reqs
        if desc.cg_mode == FULL:  # the graph samples too: its sample phase is part of verify_ms
            graphs.replay(desc)
        else:
            logits = self._verify(batch, prep)
            timer.mark("sample")
            self._sample(logits, num_reqs)
        host, done = self._start_read_back(num_reqs)
        timer.mark("draft")
        if self.speculator is not None:
            _, probs = self.speculator.propose(self._verified_batch(batch, prep))
            if probs is not None:
                self.req_draft_probs[self.row_inputs[:num_reqs, self.k + 4]] = probs
        timer.mark("end")
        if self.lookahead:
            # Commit the previous step's tokens now that this one is queued, then this step's counts.
            previous = self._in_flight
            self._in_flight = InFlightStep(batch, host, done)
            finished = None
            if previous is not None:
                finished = self._commit_read_back(previous)
            record = self._commit_provisional(self._in_flight, t_start)
        else:
            if done is not None:
                done.synchronize()  # the verify and the sampler are done; the draft may still run
            finished = self.finish_timing()  # the previous step's draft ran before this verify: its times are in
            record = self._commit(batch, host, t_start)
        self._pending = (record, timer.stamps())
        self.steps.append(record)
        return finished

    def _dispatch(self, batch: ScheduledBatch) -> tuple[BatchExecutionDescriptor, CudaGraphManager]:
        """How the step runs, and the graph manager that counts it: a lone prompt chunk that fits a prefill
        graph's token count replays the smallest such graph; anything else goes to the verify graphs (uniform
        batches of k+1 tokens a row) or runs eagerly."""
        max_seq_len = max(r.request.num_computed_tokens + r.num_query_tokens for r in batch.rows)
        if batch.num_reqs == 1 and batch.rows[0].is_prefill:
            prompt = self.prefill_graphs.dispatch(batch.rows[0].num_query_tokens, max_seq_len)
            if prompt is not None:
                return prompt
        uniform = all(not r.is_prefill and r.num_query_tokens == self.k + 1 for r in batch.rows)
        return self.verify_graphs.dispatch(batch.num_reqs, batch.num_tokens, uniform, max_seq_len), self.verify_graphs

    def _start_read_back(self, num_reqs: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Queue the step's one device-to-host copy: `step_out[:num_reqs]`, int64[R, k+2], the emitted tokens
        [k+1] and their count per row. On a GPU the copy lands in page-locked memory (one of two buffers, used
        by alternate steps) once the returned event has fired; on CPU it is done on return (event None)."""
        out = self.step_out[:num_reqs]
        if self.readback_done is None:
            return out.clone(), None
        self._read_back_slot ^= 1
        host = self.host_out[self._read_back_slot][:num_reqs]
        host.copy_(out, non_blocking=True)
        done = self.readback_done[self._read_back_slot]
        done.record()
        return host, done

    def _prepare_target_inputs(self, batch: ScheduledBatch, desc: BatchExecutionDescriptor) -> dict:
        k, dev = self.k, self.device
        rows = batch.rows
        token_lists, starts, block_ids = [], [], []
        for row in rows:
            req = row.request
            start = req.num_computed_tokens
            if row.is_prefill:
                token_lists.append(req.token_ids[start : start + row.num_query_tokens])
            else:  # the drafts are gathered on the device below
                token_lists.append([req.token_ids[-1]] + [0] * (row.num_query_tokens - 1))
            starts.append(start)
            block_ids.append(req.block_ids)
        cpu = build_step_inputs(token_lists, starts, block_ids, self.cfg.block_size, self.max_blocks_per_req,
                                desc.num_reqs, desc.num_tokens, pin_memory=self.pin_memory)
        self.buffers.load(cpu, desc.num_reqs, desc.num_tokens)
        num_reqs, num_tokens = cpu.num_reqs, cpu.num_tokens
        attn = self.buffers.attention_metadata(
            num_reqs, num_tokens, max_seq_len=desc.max_seq_len, max_query_len=cpu.max_query_len,
            num_actual_tokens=num_tokens,
        )
        # Per-row CPU facts, one tensor per dtype, for the speculator (VerifiedBatch) and the conv builder:
        # plain decoding of an attention-only target needs none. Every decode row is a spec row (0..k drafts),
        # even without speculation: its conv window then sits at num_accepted - 1, and the spec path is the one
        # full graphs replay. The conv builder's draft count is the drafts in each row's query (scored, not
        # capped).
        query_lens = starts_t = is_spec = samples_cpu = slots = num_accepted = None
        if self.speculator is not None:
            query_lens, starts_t = torch.tensor(
                [r.num_query_tokens for r in rows] + starts, dtype=torch.int64).view(2, num_reqs).unbind(0)
            is_spec, samples_cpu = torch.tensor(
                [not r.is_prefill for r in rows] + [r.samples for r in rows]).view(2, num_reqs).unbind(0)
        if self.speculator is not None or self.conv_states:
            slots, num_accepted, starts_32, query_drafts = torch.tensor(
                [r.request.conv_slot for r in rows] + [r.request.num_accepted_tokens for r in rows] + starts
                + [r.num_query_tokens - 1 if not r.is_prefill else -1 for r in rows],
                dtype=torch.int32).view(4, num_reqs).unbind(0)
        conv = None
        if self.conv_states and desc.cg_mode == FULL and rows[0].is_prefill:
            # a prompt-prefill graph (verify graphs take no prefill rows): its one-row persistent buffers
            self.conv_builder.load_prompt_row(query_len=rows[0].num_query_tokens, num_tokens_padded=desc.num_tokens,
                                              num_computed_tokens=starts[0], state_index=rows[0].request.conv_slot)
        elif self.conv_states:
            conv = self.conv_builder.build(
                query_start_loc_cpu=cpu.query_start_loc,
                num_computed_tokens_cpu=starts_32,
                num_decode_draft_tokens_cpu=query_drafts,
                num_accepted_tokens_cpu=num_accepted,
                state_indices_cpu=slots,
                num_reqs_padded=desc.num_reqs if desc.cg_mode == FULL else None,
            )
        # Per row, its line of `row_inputs` (verify rows score every query token, others their last one,
        # repeated; padding rows all zero), then, per draft in a query, the token it fills and its place in the
        # draft buffer (flat): one packed host-to-device copy.
        packed_rows, fill_tokens, fill_sources = [], [], []
        for row, start in zip(rows, cpu.query_start_loc.tolist()):
            req, last = row.request, row.num_query_tokens - 1
            packed_rows += [start + (last if row.is_prefill else min(c, last)) for c in range(k + 1)]
            packed_rows += [max(req.draft_row, 0), row.num_draft_tokens, int(row.samples), req.conv_slot]
            if row.is_prefill:
                continue
            if last > 0:  # its drafts, from the speculator's draft buffer
                fill_tokens += range(start + 1, start + 1 + last)
                fill_sources += range(req.draft_row * k, req.draft_row * k + last)
            if req.pending_token_row >= 0:  # its last token, from the in-flight step's (k = 0)
                fill_tokens.append(start)
                fill_sources.append(req.pending_token_row)
        width, rows_padded = k + 5, max(desc.num_reqs, num_reqs)
        packed_rows += [0] * ((rows_padded - num_reqs) * width)
        packed = torch.tensor(packed_rows + fill_tokens + fill_sources, dtype=torch.int64, pin_memory=self.pin_memory)
        self.row_inputs[:rows_padded].copy_(packed[: rows_padded * width].view(rows_padded, width), non_blocking=True)
        if fill_tokens:
            # drafts: flat in the draft buffer; a pending token (k = 0): the in-flight step's, in step_out's
            # first column, which this step's sampling overwrites only after this gather
            source = self.speculator.draft_tokens.view(-1) if self.speculator is not None else self.step_out[:, 0]
            fill = packed[rows_padded * width :].to(dev, non_blocking=True).view(2, -1)
            self.buffers.input_ids[fill[0]] = source[fill[1]]
        return {
            "cpu": cpu, "attn": attn, "conv": conv, "query_lens": query_lens, "is_spec": is_spec,
            "slots": slots, "num_accepted": num_accepted, "samples_cpu": samples_cpu, "starts": starts_t,
        }

    def _verify(self, batch: ScheduledBatch, prep: dict) -> torch.Tensor:
        """Target forward over the step; logits fp32[R, k+1, V] at the rows' scoring positions."""
        num_tokens = prep["cpu"].num_tokens
        ctx = ForwardContext(attn=prep["attn"], conv=prep["conv"], kv_caches=self.kv_caches,
                             conv_states=self.conv_states)
        hidden = self.target(self.buffers.input_ids[:num_tokens], self.buffers.positions[:num_tokens], ctx)
        return self._logits_at_scoring_rows(hidden, batch.num_reqs)

    def _logits_at_scoring_rows(self, hidden: torch.Tensor, num_rows: int) -> torch.Tensor:
        """hidden [T, H] -> logits fp32[num_rows, k+1, V] at each row's scoring positions (`row_inputs`)."""
        idx = self.row_inputs[:num_rows, : self.k + 1]
        return self.target.compute_logits(hidden[idx.reshape(-1)]).view(num_rows, self.k + 1, -1)

    def _verified_batch(self, batch: ScheduledBatch, prep: dict) -> VerifiedBatch:
        cpu = prep["cpu"]
        return VerifiedBatch(
            query_lens=prep["query_lens"],
            start_positions=prep["starts"],
            is_spec=prep["is_spec"],
            samples=prep["samples_cpu"],
            conv_slots=prep["slots"],
            num_accepted_prev=prep["num_accepted"],
            block_table=cpu.block_table,
            target_input_ids=self.buffers.input_ids[: cpu.num_tokens],
            sampled=self.step_out[: batch.num_reqs, : self.k + 1],
            num_sampled=self.step_out[: batch.num_reqs, self.k + 1],
        )

    # ------------------------------------------------------------------ bookkeeping
    def _commit(self, batch: ScheduledBatch, host: torch.Tensor, t_start: float) -> StepRecord:
        """Commit the step's emitted tokens (host: int64[R, k+2] as read back) to its requests. The record's
        phase times are filled in once the step's draft has finished (finish_timing)."""
        k = self.k
        now = time.perf_counter() - self._t0
        num_drafts = num_draft_tokens = num_accepted_total = num_output = 0
        host_rows = host.tolist()
        for r, row in enumerate(batch.rows):
            req = row.request
            n_sampled = host_rows[r][k + 1]
            if row.is_prefill:
                req.num_computed_tokens += row.num_query_tokens
            else:
                req.num_computed_tokens += n_sampled  # t_last + accepted drafts are now in the cache
            if not row.samples:
                continue
            accepted = n_sampled - 1
            if row.num_draft_tokens > 0:
                req.verifies.append((row.num_draft_tokens, accepted))
                num_drafts += 1
                num_draft_tokens += row.num_draft_tokens
                num_accepted_total += accepted
            req.num_accepted_tokens = n_sampled
            emitted = self._append_tokens(req, host_rows[r][:n_sampled])
            req.emitted_per_step.append(emitted)
            num_output += emitted
            if emitted and req.first_token_s is None:
                req.first_token_s = now
            if req.finished:
                req.finish_s = now
                self.scheduler.finish(req)
            elif k > 0:  # its drafts wait in row r of the speculator's draft buffer
                req.num_pending_drafts, req.draft_row = k, r
        return self._step_record(batch, t_start, num_output, num_drafts, num_draft_tokens, num_accepted_total)

    def _step_record(self, batch: ScheduledBatch, t_start: float, num_output: int, num_drafts: int = 0,
                     num_draft_tokens: int = 0, num_accepted: int = 0) -> StepRecord:
        """The step's record, its wall time up to now; phase times are filled in by finish_timing."""
        return StepRecord(
            step=len(self.steps), num_reqs=batch.num_reqs, num_tokens=batch.num_tokens,
            num_prefill_tokens=sum(r.num_query_tokens for r in batch.rows if r.is_prefill),
            num_drafts=num_drafts, num_draft_tokens=num_draft_tokens, num_accepted_tokens=num_accepted,
            num_output_tokens=num_output, schedule_ms=0.0, verify_ms=0.0, sample_ms=0.0, draft_ms=0.0,
            step_ms=(time.perf_counter() - t_start) * 1e3,
        )

    def _commit_provisional(self, step: InFlightStep, t_start: float) -> StepRecord:
        """Plain-decoding lookahead: commit a queued step's counts before its tokens are read back. Each row
        that samples emits exactly one token: a placeholder in token_ids until `_commit_read_back`, which the
        next step's input gathers from the device. Rows of requests that stopped at EOS in the step before are
        discarded. Requests that reach max_new_tokens or max_model_len stop here."""
        num_output = 0
        for r, row in enumerate(step.batch.rows):
            req = row.request
            step.committed_rows.append(not req.finished)
            if req.finished:
                continue
            req.num_computed_tokens += row.num_query_tokens  # one token a decode row
            if not row.samples:
                continue
            req.token_ids.append(0)
            req.pending_token_row = r
            req.num_accepted_tokens = 1
            req.emitted_per_step.append(1)
            num_output += 1
            if req.num_output_tokens >= req.max_new_tokens:
                req.finished, req.finish_reason = True, "length"
            elif len(req.token_ids) >= self.cfg.max_model_len:
                req.finished, req.finish_reason = True, "max_model_len"
            if req.finished:
                self.scheduler.finish(req)
        return self._step_record(step.batch, t_start, num_output)

    def _commit_read_back(self, step: InFlightStep) -> StepRecord | None:
        """Plain-decoding lookahead: wait for a queued step's read-back and put its tokens in place of the
        placeholders; a request whose token is EOS stops here. Returns the record finish_timing completed."""
        if step.done is not None:
            step.done.synchronize()
        finished = self.finish_timing()
        now = time.perf_counter() - self._t0
        host_rows = step.host.tolist()
        for r, row in enumerate(step.batch.rows):
            req = row.request
            if not (step.committed_rows[r] and row.samples):
                continue
            token = host_rows[r][0]
            req.token_ids[-1] = token  # no placeholder has been added after this one
            req.pending_token_row = -1
            if req.first_token_s is None:
                req.first_token_s = now
            if token in self.eos_token_ids and not self.sampling.ignore_eos:
                if not req.finished:
                    self.scheduler.finish(req)
                req.finished, req.finish_reason = True, "eos"
            if req.finished and req.finish_s is None:
                req.finish_s = now
        return finished

    def _append_tokens(self, req: Request, tokens: list[int]) -> int:
        """Commit sampled tokens, stopping at EOS, max_new_tokens or max_model_len. Returns how many."""
        emitted = 0
        for token in tokens:
            req.token_ids.append(token)
            emitted += 1
            if token in self.eos_token_ids and not self.sampling.ignore_eos:
                req.finished, req.finish_reason = True, "eos"
            elif req.num_output_tokens >= req.max_new_tokens:
                req.finished, req.finish_reason = True, "length"
            elif len(req.token_ids) >= self.cfg.max_model_len:
                req.finished, req.finish_reason = True, "max_model_len"
            if req.finished:
                break
        return emitted
