"""The native engine: continuous batching with draft-model speculation, one `step()` at a time.

A step:  schedule (CPU) -> target forward over all rows' queries (verify + prefill chunks) ->
rejection sampling (device) -> draft proposal (device) -> ONE device-to-host read (sampled tokens,
their counts and the next drafts) -> bookkeeping on the CPU. Nothing else is read back.
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
from specexp.engine.timing import PhaseTimer
from specexp.models.attention import ATTENTION_KERNELS, use_attention_kernel
from specexp.models.caches import allocate_conv_states, allocate_kv_caches
from specexp.models.linear_ops import LINEAR_KERNELS, use_linear_ops
from specexp.models.metadata import ForwardContext
from specexp.models.pointwise import EAGER as EAGER_POINTWISE
from specexp.models.pointwise import compiled_pointwise_ops, use_pointwise_ops
from specexp.models.short_conv_ops import CONV_KERNELS, use_conv_kernel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class StepRecord:
    """One engine step (a row of steps.parquet). Times in milliseconds."""

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
        self.dtype = DTYPES[engine.dtype]
        self.target = target
        # Every model of this engine calls the fused (compiled) pointwise ops, or the eager ones, as configured
        # (set on the modules: a model shared by two engines follows the last one built).
        ops = compiled_pointwise_ops() if engine.compile_pointwise else EAGER_POINTWISE
        for model in (target, draft) if self.k > 0 else (target,):
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
        # Target verify graphs: uniform batches of k+1 tokens a row (1 without speculation).
        self.verify_graphs = CudaGraphManager("target_verify", self.capture_sizes, self.k + 1, self.device,
                                              enabled=self.use_graphs, seq_len_buckets=tuple(self.seq_len_buckets))
        self.verify_logits = (
            torch.zeros(engine.max_num_seqs * (self.k + 1), target.config.vocab_size, device=self.device)
            if self.use_graphs else None
        )
        self._verify_graph_ctx: dict[tuple[int, int], ForwardContext] = {}  # by (rows, key-length bucket)
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
                capture_sizes=self.capture_sizes, seq_len_buckets=self.seq_len_buckets,
            )
            if not sampling.greedy:
                # Draft probabilities of each request's pending drafts, by conv slot (a request's stable id).
                self.req_draft_probs = torch.zeros(
                    engine.max_num_seqs + 1, self.k, target.config.vocab_size, device=self.device
                )
        self.timer = PhaseTimer(self.device)
        self.steps: list[StepRecord] = []
        self._t0 = 0.0
        self.graph_capture: dict | None = None
        if self.use_graphs:
            self.capture()

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
        managers = [self.verify_graphs]
        if self.speculator is not None:
            managers += [self.speculator.prefill_graphs, self.speculator.decode_graphs]
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
        """The captured verify: every token of a uniform batch is scored into `verify_logits`."""
        num_tokens = desc.num_tokens
        hidden = self.target(self.buffers.input_ids[:num_tokens], self.buffers.positions[:num_tokens],
                             self._verify_graph_ctx[(desc.num_reqs, desc.max_seq_len)])
        self.verify_logits[:num_tokens].copy_(self.target.compute_logits(hidden))

    def persistent_buffer_bytes(self) -> int:
        total = self.buffers.nbytes()
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
        self.steps = []
        for request in requests:
            self.scheduler.add(request)
        self._t0 = time.perf_counter()
        while self.scheduler.has_work:
            record = self.step()
            if on_step is not None:
                on_step(record)
        return EngineOutput(requests, list(self.steps), time.perf_counter() - self._t0,
                            self.persistent_buffer_bytes(), self.graph_summary())

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def step(self) -> StepRecord:
        timer = self.timer
        t_start = time.perf_counter()
        timer.start("schedule")
        batch = self.scheduler.schedule()
        if not batch.rows:
            raise RuntimeError("scheduler produced an empty step while requests are waiting")
        uniform = all(not r.is_prefill and r.num_query_tokens == self.k + 1 for r in batch.rows)
        max_seq_len = max(r.request.num_computed_tokens + r.num_query_tokens for r in batch.rows)
        desc = self.verify_graphs.dispatch(batch.num_reqs, batch.num_tokens, uniform, max_seq_len)
        prep = self._prepare_target_inputs(batch, desc)
        timer.mark("verify")
        if desc.cg_mode == FULL:
            self.verify_graphs.replay(desc)
            logits = self.verify_logits[: desc.num_tokens].view(desc.num_reqs, self.k + 1, -1)[: batch.num_reqs]
        else:
            logits = self._verify(batch, prep)
        timer.mark("sample")
        verified = self.rejection(
            logits, prep["drafts"], prep["num_drafts"], prep["draft_probs"], prep["samples"]
        )
        timer.mark("draft")
        drafts = None
        if self.speculator is not None:
            drafts, probs = self.speculator.propose(self._verified_batch(batch, prep, verified))
            if probs is not None:
                self.req_draft_probs[prep["slots_dev"]] = probs
        # The step's single device-to-host read.
        parts = [verified.sampled, verified.num_sampled.unsqueeze(1)]
        if drafts is not None:
            parts.append(drafts)
        host = torch.cat(parts, dim=1).cpu()
        timer.mark("end")
        record = self._commit(batch, host, timer.elapsed_ms(), t_start)
        self.steps.append(record)
        return record

    def _prepare_target_inputs(self, batch: ScheduledBatch, desc: BatchExecutionDescriptor) -> dict:
        k, dev = self.k, self.device
        rows = batch.rows
        token_lists, starts, block_ids = [], [], []
        for row in rows:
            req = row.request
            start = req.num_computed_tokens
            if row.is_prefill:
                token_lists.append(req.token_ids[start : start + row.num_query_tokens])
            else:
                token_lists.append([req.token_ids[-1]] + req.draft_token_ids[: row.num_query_tokens - 1])
            starts.append(start)
            block_ids.append(req.block_ids)
        cpu = build_step_inputs(token_lists, starts, block_ids, self.cfg.block_size, self.max_blocks_per_req,
                                desc.num_reqs, desc.num_tokens)
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
        if self.conv_states:
            conv = self.conv_builder.build(
                query_start_loc_cpu=cpu.query_start_loc,
                num_computed_tokens_cpu=starts_32,
                num_decode_draft_tokens_cpu=query_drafts,
                num_accepted_tokens_cpu=num_accepted,
                state_indices_cpu=slots,
                num_reqs_padded=desc.num_reqs if desc.cg_mode == FULL else None,
            )
        # Per row, one int64 line of the packed host-to-device copy: logits rows [k+1] (verify rows score
        # every query token, others their last one, repeated), drafts [k] (zero-padded), the count of drafts
        # it may accept, whether the row samples, and its conv slot (which also indexes its draft probs).
        packed_rows = []
        for row, start in zip(rows, cpu.query_start_loc.tolist()):
            last = row.num_query_tokens - 1
            logits_rows = [start + (last if row.is_prefill else min(c, last)) for c in range(k + 1)]
            drafts_row = [] if row.is_prefill else row.request.draft_token_ids[:last]
            packed_rows.append(logits_rows + drafts_row + [0] * (k - len(drafts_row))
                               + [row.num_draft_tokens, int(row.samples), row.request.conv_slot])
        packed = torch.tensor(packed_rows, dtype=torch.int64).view(num_reqs, 2 * k + 4).to(dev, non_blocking=True)
        slots_dev = packed[:, 2 * k + 3]
        draft_probs = self.req_draft_probs[slots_dev] if self.req_draft_probs is not None else None
        return {
            "cpu": cpu, "attn": attn, "conv": conv, "query_lens": query_lens, "is_spec": is_spec,
            "slots": slots, "slots_dev": slots_dev, "num_accepted": num_accepted,
            "logits_indices": packed[:, : k + 1], "drafts": packed[:, k + 1 : 2 * k + 1],
            "num_drafts": packed[:, 2 * k + 1], "samples": packed[:, 2 * k + 2] != 0,
            "draft_probs": draft_probs,
            "samples_cpu": samples_cpu,
            "starts": starts_t,
        }

    def _verify(self, batch: ScheduledBatch, prep: dict) -> torch.Tensor:
        """Target forward over the step; logits fp32[R, k+1, V] at the rows' scoring positions."""
        num_tokens = prep["cpu"].num_tokens
        ctx = ForwardContext(attn=prep["attn"], conv=prep["conv"], kv_caches=self.kv_caches,
                             conv_states=self.conv_states)
        hidden = self.target(self.buffers.input_ids[:num_tokens], self.buffers.positions[:num_tokens], ctx)
        idx = prep["logits_indices"]
        logits = self.target.compute_logits(hidden[idx.reshape(-1)])
        return logits.view(idx.shape[0], idx.shape[1], -1)

    def _verified_batch(self, batch: ScheduledBatch, prep: dict, verified) -> VerifiedBatch:
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
            sampled=verified.sampled,
            num_sampled=verified.num_sampled,
        )

    # ------------------------------------------------------------------ bookkeeping
    def _commit(self, batch: ScheduledBatch, host: torch.Tensor, phases_ms: dict, t_start: float) -> StepRecord:
        k = self.k
        now = time.perf_counter() - self._t0
        num_drafts = num_draft_tokens = num_accepted_total = num_output = 0
        for r, row in enumerate(batch.rows):
            req = row.request
            n_sampled = int(host[r, k + 1])
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
            emitted = self._append_tokens(req, host[r, :n_sampled].tolist())
            req.emitted_per_step.append(emitted)
            num_output += emitted
            if emitted and req.first_token_s is None:
                req.first_token_s = now
            if req.finished:
                req.finish_s = now
                self.scheduler.finish(req)
            elif k > 0:
                req.draft_token_ids = host[r, k + 2 :].tolist()
        phases = {name: phases_ms.get(name, 0.0) for name in ("schedule", "verify", "sample", "draft")}
        return StepRecord(
            step=len(self.steps), num_reqs=batch.num_reqs, num_tokens=batch.num_tokens,
            num_prefill_tokens=sum(r.num_query_tokens for r in batch.rows if r.is_prefill),
            num_drafts=num_drafts, num_draft_tokens=num_draft_tokens, num_accepted_tokens=num_accepted_total,
            num_output_tokens=num_output,
            schedule_ms=phases["schedule"], verify_ms=phases["verify"], sample_ms=phases["sample"],
            draft_ms=phases["draft"], step_ms=(time.perf_counter() - t_start) * 1e3,
        )

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
