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

Around this file: `target_graphs` (the target's CUDA graphs: capture and dispatch), `mixed_steps` (a batch of
verify rows and prompt chunks replayed in parts, one graph each), `commit` (how a read-back
becomes requests' tokens), `output` (the step records and the run's output), `progress` (the events a caller's
progress callback receives).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from specexp.engine.arrivals import ArrivalGate
from specexp.engine.cache_pool import IdPool, blocks_needed
from specexp.engine.commit import (
    InFlightStep,
    StopRule,
    commit_provisional,
    commit_read_back,
    commit_step,
    step_record,
)
from specexp.engine.compiled_graphs import step_random_source
from specexp.engine.config import EngineConfig, EngineConfigError, SamplingConfig, SpeculatorConfig
from specexp.engine.cudagraph import (
    FULL,
    CudaGraphManager,
    PromptGraphs,
    default_capture_sizes,
    default_seq_len_buckets,
)
from specexp.engine.depth import StaticDepth, depth_policy, describe_graph_cost, graph_keys
from specexp.engine.draft_advance import DRAFT_STEP_KERNELS
from specexp.engine.goodput import StepCostTable
from specexp.engine.inputs import InputBuffers
from specexp.engine.mixed_graphs import TargetMixedGraphs
from specexp.engine.mixed_steps import TargetMixedSteps
from specexp.engine.model_kernels import use_engine_kernels
from specexp.engine.output import EngineOutput, StepRecord
from specexp.engine.progress import ProgressCallback, RunReporter
from specexp.engine.read_back import StepReadBack
from specexp.engine.rejection_sampler import RejectionSampler
from specexp.engine.request import Request
from specexp.engine.reuse import EngineReuse, check_serve_depths, with_depths
from specexp.engine.sampling import ARGMAX_KERNELS
from specexp.engine.scheduler import ScheduledBatch, Scheduler
from specexp.engine.short_conv import ShortConvMetadataBuilder
from specexp.engine.speculator import AutoRegressiveSpeculator
from specexp.engine.target_graphs import TargetGraphs
from specexp.engine.target_inputs import TargetStepInputs
from specexp.engine.timing import PhaseStamps, PhaseTimer
from specexp.engine.triton_verify import sample_greedy_rows
from specexp.models.caches import allocate_conv_states, allocate_kv_caches
from specexp.models.metadata import ForwardContext
from specexp.models.pointwise import EAGER as EAGER_POINTWISE
from specexp.models.pointwise import use_pointwise_ops

# Re-exported: callers import the step records and the output from here.
__all__ = ["DTYPES", "EngineOutput", "InFlightStep", "NativeEngine", "StepRecord", "check_pair"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
log = logging.getLogger("specexp.engine")


def check_pair(target: torch.nn.Module, draft: torch.nn.Module | None) -> None:
    """A draft must share the target's vocabulary."""
    if draft is None:
        return
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise EngineConfigError(
            f"draft vocab ({dv}) != target vocab ({tv}): a draft must share the target's tokenizer"
        )


class NativeEngine(TargetGraphs, TargetStepInputs, TargetMixedSteps, TargetMixedGraphs, EngineReuse):
    """Serves a list of prompts with the target model, optionally speculating with a draft model.

    eos_token_ids: tokens that end a request (unless sampling.ignore_eos). progress: receives the CUDA-graph
    capture's events (`specexp.engine.progress`); `generate` takes its own for the run's. step_costs: the step
    costs `adaptive: goodput` weighs (`specexp.engine.goodput`); None = measured at start-up. serve_depths: static
    depths in 0..K a later `use_static_depth` may switch to; their graphs are captured at start-up too (one engine
    for several sweep points, `specexp.engine.reuse`).
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
        progress: ProgressCallback | None = None,
        step_costs: StepCostTable | None = None,
        serve_depths: Sequence[int] = (),
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
        use_engine_kernels((target, draft) if self.k > 0 else (target,), engine)
        self.eos_token_ids = set(eos_token_ids or [])
        self.stop = StopRule(self.eos_token_ids, sampling.ignore_eos, engine.max_model_len)
        self.progress = progress
        # On CUDA, sampling uses the default generator: CUDA graphs capture its Philox state natively.
        self.generator = None if self.device.type == "cuda" else torch.Generator(device=self.device)
        self.reseed(engine.seed)
        lookahead = 2 * self.k + 1 if self.k else 0
        self.max_blocks_per_req = blocks_needed(engine.max_model_len + lookahead, engine.block_size)
        num_blocks = engine.num_kv_blocks or engine.max_num_seqs * self.max_blocks_per_req
        self.block_pool = IdPool(num_blocks)
        self.slot_pool = IdPool(engine.max_num_seqs)
        # Each step's k in 0..K (specexp.engine.depth); K = self.k sizes every buffer below.
        self.depth = depth_policy(speculator, self.k) if self.k > 0 else StaticDepth(0)
        self.scheduler = Scheduler(
            max_num_seqs=engine.max_num_seqs, max_model_len=engine.max_model_len, token_budget=engine.token_budget,
            block_size=engine.block_size, num_spec_tokens=self.k, block_pool=self.block_pool,
            slot_pool=self.slot_pool, step_depth=self.depth.step_k)
        self.max_num_tokens = self.scheduler.token_budget
        # +1: block id / conv slot 0 is the NULL entry.
        self.kv_caches = allocate_kv_caches(target, num_blocks + 1, engine.block_size, self.device, self.dtype)
        self.conv_states = allocate_conv_states(target, engine.max_num_seqs + 1, self.k, self.device, self.dtype)
        # FULL on a CPU: each graph's step compiled by torch.compile, drawing from a tape (`compiled_graphs`);
        # emulate_graphs_on_cpu (tests) pads and replays through the persistent buffers, compiling nothing.
        self.use_graphs = engine.cudagraph_mode == FULL
        self.compiled_graphs = self.use_graphs and self.device.type != "cuda" and not emulate_graphs_on_cpu
        self.random = step_random_source(self.generator, self.compiled_graphs, engine.max_num_seqs, self.k,
                                         target.config.vocab_size, not sampling.greedy, self.device)
        # A size above max_num_seqs becomes max_num_seqs: no batch is larger, and one between the largest size
        # below it and max_num_seqs pads to it rather than running eagerly.
        self.capture_sizes = sorted({
            min(s, engine.max_num_seqs)
            for s in (engine.cudagraph_capture_sizes or default_capture_sizes(engine.max_num_seqs))})
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
        # The (size, k) keys the depth policy can produce; a static K's, to report what the policy costs.
        captured_depths = speculator.cudagraph_num_speculative_tokens if self.k > 0 else None
        self.serve_depths = check_serve_depths(serve_depths, self.k)
        self.graph_keys = graph_keys(with_depths(self.depth.step_depths, self.serve_depths), self.capture_sizes,
                                     engine.max_num_seqs,
                                     captured_depths, mixed_parts=bool(engine.cudagraph_prefill_tokens))
        self.static_graph_keys = graph_keys(StaticDepth(self.k).step_depths, self.capture_sizes, engine.max_num_seqs)
        # Target verify graphs: uniform batches of v+1 tokens a row (v drafts; 1 token without speculation).
        self.verify_graphs = CudaGraphManager("target_verify", self.capture_sizes, 1, self.device,
                                              enabled=self.use_graphs, seq_len_buckets=tuple(self.seq_len_buckets),
                                              pool=self.graph_pool, tokens_per_draft=1,
                                              capture_keys=self.graph_keys.verify)
        # Per row of a step, what the rejection sampler reads (filled by one host-to-device copy, padding rows
        # zero): logits rows [k+1], the row of the speculator's draft buffer holding its drafts, the count of
        # drafts it may accept, whether it samples, its conv slot (which also indexes its draft probs).
        self.row_inputs = torch.zeros(engine.max_num_seqs, self.k + 5, dtype=torch.int64, device=self.device)
        # What the sampler emits per row, as read back: tokens [k+1] (left-aligned, -1 after), their count, and
        # the drafts it verified (fewer than it carried when the confidence rule masked some).
        self.step_out = torch.zeros(engine.max_num_seqs, self.k + 3, dtype=torch.int64, device=self.device)
        self._verify_graph_ctx: dict[tuple[int, int, int], ForwardContext] = {}  # by (rows, v, key-length bucket)
        # One-request prompt prefills, one manager per token count (a "batch" of one row of that many tokens).
        prefill_tokens = engine.cudagraph_prefill_tokens if self.use_graphs else ()
        self.prefill_graphs = PromptGraphs("target_prefill", prefill_tokens, self.device,
                                           tuple(self.seq_len_buckets), pool=self.graph_pool)
        self._prefill_graph_ctx: dict[tuple[int, int], ForwardContext] = {}  # by (tokens, key-length bucket)
        self._init_mixed_graphs()  # a prompt chunk beside verify rows in one graph (`mixed_graphs`)
        self.rejection = RejectionSampler(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            mode=speculator.rejection, synthetic_acceptance_rate=speculator.synthetic_acceptance_rate,
            synthetic_conditional_rates=speculator.synthetic_conditional_rates() if self.k else None,
            generator=self.random, argmax=ARGMAX_KERNELS[engine.argmax_kernel](self.device, self.max_num_tokens),
        )
        self.greedy_rows_kernel = engine.sampler_kernel == "triton" and sampling.greedy  # else: the torch path
        self.speculator: AutoRegressiveSpeculator | None = None
        self.req_draft_probs: torch.Tensor | None = None
        if self.k > 0:
            self.speculator = AutoRegressiveSpeculator(
                draft, num_speculative_tokens=self.k, max_num_reqs=engine.max_num_seqs,
                max_num_tokens=self.max_num_tokens, num_blocks=num_blocks + 1, block_size=engine.block_size,
                max_blocks_per_req=self.max_blocks_per_req, temperature=sampling.temperature,
                device=self.device, dtype=self.dtype, generator=self.random,
                use_cuda_graphs=self.use_graphs and speculator.cudagraph_mode == FULL,
                capture_sizes=self.capture_sizes, seq_len_buckets=self.seq_len_buckets, graph_pool=self.graph_pool,
                # a prompt chunk's draft region is its tokens + the sampled one
                prompt_graph_tokens=tuple(n + 1 for n in self.prefill_graphs.managers),
                prefill_graph_keys=self.graph_keys.verify, decode_graph_keys=self.graph_keys.decode,
                confidence_threshold=speculator.draft_confidence_threshold,
                # the chunks' draft regions: each its tokens + the sampled one
                mixed_chunk_shapes=tuple((rows, count + 1) for rows, count in self.mixed_graphs.managers),
                argmax=ARGMAX_KERNELS[engine.argmax_kernel](self.device, self.max_num_tokens),
                step_kernels=DRAFT_STEP_KERNELS[engine.draft_step_kernel], prefill_region=engine.draft_prefill_region,
            )
            if not sampling.greedy:
                # Draft probabilities of each request's pending drafts, by conv slot (a request's stable id).
                self.req_draft_probs = torch.zeros(
                    engine.max_num_seqs + 1, self.k, target.config.vocab_size, device=self.device
                )
        self.timer = PhaseTimer(self.device)
        # Each step's read-back of `step_out` (emitted tokens [K+1], their count, the drafts verified, per row).
        self.read_back = StepReadBack(engine.max_num_seqs, self.k + 3, self.device, self.pin_memory)
        # draft_off: a run at static depth 0 on an engine with a draft, served as a K = 0 engine would
        # (`EngineReuse.use_static_depth`).
        self.draft_off = False
        self._in_flight: InFlightStep | None = None
        # The last step's record, whose phase times are read when its draft has finished (one step late).
        self._pending: tuple[StepRecord, PhaseStamps] | None = None
        self.steps: list[StepRecord] = []
        self._t0 = 0.0
        self.graph_capture: dict | None = None
        if self.use_graphs:
            log.info(describe_graph_cost(self.graph_keys, self.static_graph_keys, len(self.seq_len_buckets),
                                         set().union(*(self.depth.step_depths(n)
                                                       for n in range(1, engine.max_num_seqs + 1))),
                                         self.speculator is not None and self.speculator.last_two_regions))
            self.capture()
            if engine.compile_pointwise and self.device.type == "cuda":
                # The graphs hold the fused kernels. Steps that run eagerly (prefills, mixed batches) call the
                # plain ops: a compiled function's Python dispatch (guards, wrappers) costs the host more than
                # the few kernel launches it saves, and an eager step is bound by the host.
                for model in (target, draft) if self.k > 0 else (target,):
                    use_pointwise_ops(model, EAGER_POINTWISE)
        # adaptive: goodput weighs each k by the step costs measured here, once (or those given).
        self.step_costs: StepCostTable | None = None
        if self.k > 0 and speculator.adaptive == "goodput":
            if step_costs is None:
                step_costs = self.measure_step_costs()
                step_costs.fixed_ms = self.measure_fixed_ms(step_costs)
            self.step_costs = step_costs
            self.depth.costs = self.step_costs
        # Capture, warm-up and the step-cost runs drew random numbers (inert rows are sampled): every engine starts
        # serving from engine.seed itself, whatever it captured, as an engine reused for a sweep point does.
        self.reseed(engine.seed)

    def _sample(self, logits: torch.Tensor, num_rows: int) -> None:
        """Rejection-sample rows [0, num_rows) from logits fp32[num_rows, v+1, V] (v: the most drafts a row
        carries this step) and the rows' inputs in `row_inputs` (drafts gathered from the speculator's draft
        buffer, masked by its `draft_lengths` under the confidence rule); writes `step_out[:num_rows]`."""
        if self.greedy_rows_kernel:  # engine.sampler_kernel=triton, greedy: one kernel after the argmax
            return sample_greedy_rows(logits, self.rejection, self.speculator, self.row_inputs, self.step_out, self.k)
        k, rows, v = self.k, self.row_inputs[:num_rows], logits.shape[1] - 1
        spec = self.speculator
        drafts = spec.draft_tokens[rows[:, k + 1], :v] if spec is not None else rows[:, :0]
        draft_probs = self.req_draft_probs[rows[:, k + 4], :v] if self.req_draft_probs is not None else None
        num_drafts = rows[:, k + 2]
        if spec is not None and spec.confidence_threshold > 0:
            num_drafts = torch.minimum(num_drafts, spec.draft_lengths[rows[:, k + 1]])
        samples = rows[:, k + 3] != 0
        verified = self.rejection(logits, drafts, num_drafts, draft_probs, samples)
        out = self.step_out[:num_rows]
        out[:, : v + 1].copy_(verified.sampled)
        out[:, v + 1 : k + 1].fill_(-1)
        out[:, k + 1].copy_(verified.num_sampled)
        out[:, k + 2].copy_(torch.where(samples, num_drafts, 0))

    @property
    def drafting(self) -> bool:
        """Whether steps run the draft: a speculator, and no run at static depth 0 (`draft_off`)."""
        return self.speculator is not None and not self.draft_off

    @property
    def lookahead(self) -> bool:
        """Plain decoding (no draft running) queues each step before the last one is read back
        (`engine.plain_decode_lookahead`)."""
        return not self.drafting and self.cfg.plain_decode_lookahead

    def persistent_buffer_bytes(self) -> int:
        total = self.buffers.nbytes() + sum(t.numel() * t.element_size() for t in (self.row_inputs, self.step_out))
        if self.drafting:
            total += self.speculator.persistent_buffer_bytes()
        if self.drafting and self.req_draft_probs is not None:
            total += self.req_draft_probs.numel() * self.req_draft_probs.element_size()
        return total

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int | None = None,
                 on_step=None, progress: ProgressCallback | None = None, arrival_s: Sequence[float] | None = None,
                 max_concurrency: int | None = None) -> EngineOutput:
        """Serve all prompts to completion. prompts: token ids per request.

        arrival_s: per prompt, when it arrives, in seconds after the call starts (None: all at once);
        max_concurrency: requests in flight at most, a new one arriving when one finishes (closed loop; None:
        no cap). A request joins the running batch at the first step after it arrived
        (`specexp.engine.arrivals`); with nothing to run the engine sleeps until the next arrival.

        on_step(record) receives every step's record once, its phase times in (one step late). progress
        receives the run's RUN events: requests done of len(prompts), output tokens, elapsed seconds."""
        max_new = max_new_tokens or self.sampling.max_new_tokens
        requests = [Request(i, list(p), max_new) for i, p in enumerate(prompts)]
        self.steps, self._pending, self._in_flight = [], None, None
        self._staged = None  # the buffers' last step is not this run's
        self.depth.reset()
        for request in requests:
            self.scheduler.check(request)
        gate = ArrivalGate(requests, arrival_s, max_concurrency)
        scheduler, total, output_tokens = self.scheduler, len(requests), 0
        self._t0 = time.perf_counter()
        reporter = RunReporter(progress, total, self._t0) if progress is not None else None
        if reporter is not None:
            reporter.update(0, 0, self._t0)
        while True:
            now_s = time.perf_counter() - self._t0
            for request in gate.release(now_s):
                scheduler.add(request)
            if not scheduler.has_work:
                if self._in_flight is not None:  # its read-back may finish requests and free their slots
                    timed = self._commit_read_back(self._in_flight)
                    self._in_flight = None
                    if timed is not None and on_step is not None:
                        on_step(timed)
                    continue
                next_s = gate.next_arrival_s()
                if next_s is None:
                    if gate.num_pending:
                        raise RuntimeError("requests wait for a concurrency slot that no request in flight holds")
                    break
                time.sleep(max(next_s - now_s, 0.0))
                continue
            in_flight, waiting = gate.num_in_flight, len(scheduler.waiting)
            timed = self.step()
            self.steps[-1].num_in_flight, self.steps[-1].num_waiting = in_flight, waiting
            if timed is not None and on_step is not None:
                on_step(timed)
            if reporter is not None:
                output_tokens += self.steps[-1].num_output_tokens
                done = total - len(scheduler.waiting) - len(scheduler.running) - gate.num_pending
                reporter.update(done, output_tokens)
        timed = None
        if self._in_flight is not None:  # the last queued step's tokens (and the times of the step before)
            timed = self._commit_read_back(self._in_flight)
            self._in_flight = None
        for record in (timed, self.finish_timing()):
            if record is not None and on_step is not None:
                on_step(record)
        if reporter is not None:
            reporter.finish(output_tokens)
        return EngineOutput(requests, list(self.steps), time.perf_counter() - self._t0,
                            self.persistent_buffer_bytes(), self.graph_summary(),
                            self.step_costs.to_dict() if self.step_costs is not None else None)

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
        for row in batch.rows:  # a request's queueing ends with the first step that runs it
            if row.request.scheduled_s is None:
                row.request.scheduled_s = t_start - self._t0
        parts = self._mixed_parts(batch)  # a mixed batch whose parts have graphs (`mixed_steps`)
        if parts is None:
            desc, graphs = self._dispatch(batch)
            prep = self._stage_step(batch, desc)  # None: a steady step, advanced on the device
        timer.mark("verify")
        num_reqs = batch.num_reqs
        if parts is not None:  # staged and replayed part by part; each graph samples its rows
            verified = self._verify_in_parts(batch, parts)
        elif desc.cg_mode == FULL:  # the graph samples too: its sample phase is part of verify_ms
            graphs.replay(desc)
        else:
            logits = self._verify(batch, prep)
            timer.mark("sample")
            self._sample(logits, num_reqs)
        host, done = self.read_back.start(self.step_out[:num_reqs])
        timer.mark("draft")
        if self.drafting:
            step_k = batch.num_speculative_tokens
            _, probs = self.speculator.propose(verified if parts else self._verified_batch(batch, prep), step_k)
            if probs is not None and step_k > 0:
                self.req_draft_probs[self.row_inputs[:num_reqs, self.k + 4], :step_k] = probs[:, :step_k]
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
            # The previous step's marks (its draft ran before this verify), read while this verify runs: off the
            # host's path from this read-back to the next launch, which a short draft must cover.
            finished = self.finish_timing()
            if done is not None:
                done.synchronize()  # the verify and the sampler are done; the draft may still run
            record = self._commit(batch, host, t_start)
        self._pending = (record, timer.stamps())
        self.steps.append(record)
        return finished

    def _verify(self, batch: ScheduledBatch, prep: dict) -> torch.Tensor:
        """Target forward over the step; logits fp32[R, v+1, V] at the rows' scoring positions (v: the most
        drafts a row carries)."""
        num_tokens = prep["cpu"].num_tokens
        ctx = ForwardContext(attn=prep["attn"], conv=prep["conv"], kv_caches=self.kv_caches,
                             conv_states=self.conv_states)
        hidden = self.target(self.buffers.input_ids[:num_tokens], self.buffers.positions[:num_tokens], ctx)
        v = max((r.num_query_tokens - 1 for r in batch.rows if not r.is_prefill), default=0)
        return self._logits_at_scoring_rows(hidden, batch.num_reqs, v)

    def _logits_at_scoring_rows(self, hidden: torch.Tensor, num_rows: int, v: int) -> torch.Tensor:
        """hidden [T, H] -> logits fp32[num_rows, v+1, V] at each row's first v+1 scoring positions
        (`row_inputs`; a row of fewer tokens repeats its last)."""
        idx = self.row_inputs[:num_rows, : v + 1]
        return self.target.compute_logits(hidden[idx.reshape(-1)]).view(num_rows, v + 1, -1)

    # ------------------------------------------------------------------ bookkeeping
    def _commit(self, batch: ScheduledBatch, host: torch.Tensor, t_start: float) -> StepRecord:
        """Commit the step's emitted tokens (host: int64[R, k+2] as read back) to its requests (`commit_step`).
        The record's phase times are filled in once the step's draft has finished (finish_timing)."""
        now_s = time.perf_counter() - self._t0
        counts = commit_step(batch, host.tolist(), self.k, now_s, self.stop, self.scheduler.finish,
                             step_index=len(self.steps))
        return step_record(len(self.steps), batch, t_start, counts)

    def _commit_provisional(self, step: InFlightStep, t_start: float) -> StepRecord:
        """Plain-decoding lookahead: commit a queued step's counts before its tokens are read back
        (`commit_provisional`)."""
        counts = commit_provisional(step, self.stop, self.scheduler.finish, step_index=len(self.steps))
        return step_record(len(self.steps), step.batch, t_start, counts)

    def _commit_read_back(self, step: InFlightStep) -> StepRecord | None:
        """Plain-decoding lookahead: wait for a queued step's read-back and put its tokens in place of the
        placeholders (`commit_read_back`). Returns the record finish_timing completed."""
        if step.done is not None:
            step.done.synchronize()
        finished = self.finish_timing()
        commit_read_back(step, time.perf_counter() - self._t0, self.stop, self.scheduler.finish)
        return finished
