"""The target's CUDA graphs in the native engine: what is captured at start-up, and which graph a step replays.

Two kinds, both sampling inside the graph (the rejection sampler's small ops would otherwise cost the host a
launch each):
- verify graphs (`verify_graphs`): uniform batches of v+1 tokens a row (v drafts, 0 without speculation), one
  per (padded row count, v, key-length bucket), for the (size, v) keys the depth policy can produce
  (`specexp.engine.depth`);
- prompt-prefill graphs (`prefill_graphs`, `engine.cudagraph_prefill_tokens`): a lone prompt chunk padded up
  to N tokens, one manager per N.
The draft's graphs belong to the speculator (`AutoRegressiveSpeculator.capture`); `capture` here captures
them too, so the whole engine's graph memory is measured as one figure.
"""

from __future__ import annotations

import itertools
import statistics
import time

import torch

from specexp.engine.compiled_graphs import RandomTape, reserve_compiled_variants
from specexp.engine.cudagraph import (
    NONE,
    BatchExecutionDescriptor,
    CudaGraphManager,
    default_capture_sizes,
    free_device_bytes,
    graph_key,
)
from specexp.engine.frozen_heap import frozen_gc
from specexp.engine.goodput import StepCostTable
from specexp.engine.inputs import uniform_dummy_inputs
from specexp.engine.output import StepRecord
from specexp.engine.progress import CAPTURING, COMPILING, ProgressCallback, capture_reporter
from specexp.engine.reuse import depth_graph_summary
from specexp.engine.scheduler import ScheduledBatch
from specexp.models.metadata import ForwardContext


def step_periods_ms(steps: list[StepRecord], num_reqs: int, k: int) -> list[float]:
    """The step period, in ms, of each step of `steps` (one run, in order) that ran `num_reqs` rows at depth k with
    no prompt tokens: from its start to the next step's (`StepRecord.start_s`). The last step has no period."""
    return [(after.start_s - step.start_s) * 1e3 for step, after in itertools.pairwise(steps)
            if step.num_reqs == num_reqs and step.num_speculative_tokens == k and step.num_prefill_tokens == 0]


class TargetGraphs:
    """The graph half of `NativeEngine` (a mixin: it reads the engine's models, buffers and caches, and calls
    its `_sample` and `_logits_at_scoring_rows`). Captures every graph once and dispatches each step."""

    @torch.inference_mode()
    def capture(self, progress: ProgressCallback | None = None) -> None:
        """Capture every graph once, at start-up: target verify, target prompt prefill, target joined mixed
        steps, draft prefill, draft prompt prefill, draft decode.

        Records the free-memory delta of the whole capture (vLLM's figure), how much of it torch's caching allocator
        holds (`graph_capture_reserved_bytes`: the graph pools, after emptying its cache; the rest is memory outside
        the allocator, e.g. kernels loaded and library workspaces made by the first use), and each manager's
        per-size costs.
        progress (default: the engine's) receives a CAPTURE event before the first graph and after each."""
        cuda = self.device.type == "cuda"
        managers = self.graph_managers()
        total = sum(m.num_graphs_to_capture for m in managers)
        if self.compiled_graphs:  # a CPU: each graph is its step compiled by torch.compile (`compiled_graphs`)
            for manager in managers:
                manager.compile_on_cpu = True
                manager.random_tape = self.random if isinstance(self.random, RandomTape) else None
            reserve_compiled_variants(total)
        graph_captured = capture_reporter(self.progress if progress is None else progress, total,
                                          COMPILING if self.compiled_graphs else CAPTURING)
        with frozen_gc():
            free_before = free_device_bytes(self.device) if cuda else None
            reserved_before = torch.cuda.memory_reserved(self.device) if cuda else None
            start = time.perf_counter()
            self.verify_graphs.capture(self._verify_graph, self._prepare_verify_capture, graph_captured)
            self.prefill_graphs.capture(self._prefill_graph, self._prepare_prefill_capture, graph_captured)
            self.mixed_graphs.capture(self._mixed_graph, self._prepare_mixed_capture, graph_captured)
            if self.speculator is not None:
                self.speculator.capture(graph_captured)
            capture_s = time.perf_counter() - start
        self.graph_capture = {
            "graph_capture_bytes": free_before - free_device_bytes(self.device) if cuda else None,
            # after free_device_bytes emptied the allocator's cache: what the graph pools keep
            "graph_capture_reserved_bytes": (torch.cuda.memory_reserved(self.device) - reserved_before
                                             if cuda else None),
            "graph_capture_s": capture_s if cuda or self.compiled_graphs else None,  # a CPU's: compile time
            # of it, compiling: each key's first run (kernels compiled or loaded from the on-disk caches), a CPU's
            # compile
            "graph_compile_s": (sum(r.compile_s for m in self.graph_managers() for r in m.records)
                                if cuda or self.compiled_graphs else None),
        }

    @torch.inference_mode()
    def measure_step_costs(self, reps: int = 5) -> StepCostTable:
        """The step costs `adaptive: goodput` weighs: t_verify(v+1, size) for v = 0..K and t_draft(k, size) (the
        draft's k - 1 fused decode steps, k = 2..K; 0 below) at sizes 1, 2, 4, ... max_num_seqs, on inert batches
        at the smallest key-length bucket, each run as a step of that shape runs: its graph's replay when its
        (size, k) was captured, else eagerly. The median of `reps` runs after one warm-up, in ms. Touches no
        request's state (as capture)."""
        bucket = self.seq_len_buckets[0]
        verify_ms, draft_ms = {}, {}
        for size in default_capture_sizes(self.cfg.max_num_seqs):
            verify_ms[size] = [self._median_ms(lambda s=size, v=v: self._run_inert_verify(s, v, bucket), reps)
                               for v in range(self.k + 1)]
            draft_ms[size] = [0.0] * min(2, self.k + 1) + [
                self._median_ms(lambda s=size, k=k: self.speculator.run_inert_decode(s, bucket, k), reps)
                for k in range(2, self.k + 1)]
        return StepCostTable(verify_ms, draft_ms)

    def measure_fixed_ms(self, costs: StepCostTable) -> dict[int, list[float]]:
        """Per batch size of `costs` and per k = 0..K, what a real step of that many rows at depth k costs beyond
        its table replays t_verify(k + 1) + t_draft(k): the host's scheduling, staging and commit, the draft's
        prefill of the committed tokens, and what of the replays the host does not hide. Serves that many dummy
        requests, every step at k (the depth policy set aside), to 4 + 10 (k + 1) new tokens (about ten steps even
        were every draft accepted; fewer where max_model_len is short) and takes the median step period over its
        steps at k without prefill (:func:`step_periods_ms`), less the replays; in ms, at least 0. Leaves no
        request behind."""
        fixed: dict[int, list[float]] = {}
        room = self.cfg.max_model_len - 4 - (2 * self.k + 1)
        if room <= 4:
            return fixed
        step_depth = self.scheduler.step_depth
        token = min(3, self.target.config.vocab_size - 1)
        try:
            for size in sorted(costs.verify_ms):
                prompts = [[token] * 4 for _ in range(min(size, self.cfg.max_num_seqs))]
                fixed[size] = []
                for k in range(self.k + 1):
                    self.scheduler.step_depth = lambda rows, k=k: k
                    out = self.generate(prompts, max_new_tokens=min(4 + 10 * (k + 1), room))
                    periods = step_periods_ms(out.steps, len(prompts), k)
                    replays = costs.verify_ms[size][k] + costs.draft_ms[size][k]
                    fixed[size].append(max(statistics.median(periods) - replays, 0.0) if periods else 0.0)
        finally:
            self.scheduler.step_depth = step_depth
            self.steps = []
        return fixed

    def _run_inert_verify(self, num_reqs: int, v: int, bucket: int) -> None:
        """One verify step (target forward + sampler) of num_reqs inert rows of v drafts, as dispatch would run it."""
        desc = self.verify_graphs.lookup(num_reqs, bucket, v) if self.use_graphs else None
        desc = desc or BatchExecutionDescriptor(num_reqs, num_reqs * (v + 1), NONE, bucket, v)
        self._prepare_verify_capture(desc)
        self.verify_graphs.execute(desc, self._verify_graph)

    def _median_ms(self, run, reps: int) -> float:
        """Median wall time of run() in ms over `reps` runs after one warm-up (device synchronised around each)."""
        cuda = self.device.type == "cuda"
        times = []
        for i in range(reps + 1):
            if cuda:
                torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize(self.device)
            if i:
                times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[len(times) // 2]

    def target_graph_managers(self) -> list[CudaGraphManager]:
        """The target's graph managers: verify, prompt prefill, joined mixed steps."""
        return [self.verify_graphs, *self.prefill_graphs.managers.values(), *self.mixed_graphs.managers.values()]

    def graph_managers(self) -> list[CudaGraphManager]:
        """Every graph manager of the engine, target's then draft's."""
        managers = self.target_graph_managers()
        if self.speculator is not None:
            spec = self.speculator
            managers += [spec.prefill_graphs, *spec.prompt_graphs.managers.values(),
                         *spec.mixed_graphs.managers.values(), spec.decode_graphs]
        return managers

    def graph_summary(self) -> dict | None:
        """Capture totals, per (manager, size) costs, and replayed vs eager step counts."""
        if self.graph_capture is None:
            return None
        summary = {**self.graph_capture, "mixed_steps_in_parts": self.num_mixed_in_parts,
                   "mixed_steps_joined": self.num_mixed_joined,
                   "prompt_batches_graphed": self.num_prompt_batches_graphed,
                   "managers": {m.name: m.summary() for m in (self.graph_managers() if self.drafting
                                                               else self.target_graph_managers())}}
        if self.serve_depths:  # an engine serving several static depths reports the one it serves (`reuse`)
            return depth_graph_summary(summary, self.depth.max_k)
        return summary

    def _dispatch(self, batch: ScheduledBatch) -> tuple[BatchExecutionDescriptor, CudaGraphManager]:
        """How the step runs, and the graph manager that counts it: a lone prompt chunk that fits a prefill
        graph's token count replays the smallest such graph; anything else goes to the verify graphs (uniform
        batches of v+1 tokens a row, at the step's v) or runs eagerly."""
        rows = batch.rows
        max_seq_len = max(r.request.num_computed_tokens + r.num_query_tokens for r in rows)
        if batch.num_reqs == 1 and rows[0].is_prefill:
            prompt = self.prefill_graphs.dispatch(rows[0].num_query_tokens, max_seq_len)
            if prompt is not None:
                return prompt
        q = rows[0].num_query_tokens
        uniform = all(not r.is_prefill and r.num_query_tokens == q for r in rows)
        desc = self.verify_graphs.dispatch(batch.num_reqs, batch.num_tokens, uniform, max_seq_len, k=q - 1)
        return desc, self.verify_graphs

    def _prepare_verify_capture(self, desc: BatchExecutionDescriptor) -> None:
        """An inert uniform batch of desc.num_reqs rows of v+1 tokens (v = desc.num_speculative_tokens)."""
        query_len = desc.num_speculative_tokens + 1
        cpu = uniform_dummy_inputs(desc.num_reqs, query_len, self.max_blocks_per_req)
        self.buffers.load(cpu)
        self.row_inputs[: desc.num_reqs].zero_()  # no drafts, no sampling: the sampler's rows are inert too
        attn = self.buffers.attention_metadata(desc.num_reqs, desc.num_tokens, desc.max_seq_len, query_len,
                                               desc.num_tokens)
        conv = None
        if self.conv_states:
            conv = self.conv_builder.build_for_cudagraph_capture(num_reqs=desc.num_reqs, num_tokens=desc.num_tokens,
                                                                 query_len=query_len)
        self._verify_graph_ctx[graph_key(desc)] = ForwardContext(
            attn=attn, conv=conv, kv_caches=self.kv_caches, conv_states=self.conv_states)

    def _verify_graph(self, desc: BatchExecutionDescriptor) -> None:
        """The captured step: the target scores every token of a uniform batch of v+1 tokens a row, and the
        rejection sampler turns the logits into `step_out` (one graph, so sampling costs the host nothing)."""
        num_tokens = desc.num_tokens
        hidden = self.target(self.buffers.input_ids[:num_tokens], self.buffers.positions[:num_tokens],
                             self._verify_graph_ctx[graph_key(desc)])
        logits = self.target.compute_logits(hidden).view(desc.num_reqs, desc.num_speculative_tokens + 1, -1)
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
        self._sample(self._logits_at_scoring_rows(hidden, 1, 0), 1)
