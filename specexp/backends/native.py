"""Backend `native`: specexp's own engine (continuous batching, draft-model speculation, paged caches).

Turns a RunSpec into engine configs, loads the pair natively (torch + safetensors) and builds the engine once
(:func:`open_server`); the measurement layer warms it up and serves the workload once per repeat, every prompt
as its arrival process says (``workload.arrival``: all together, Poisson, a closed loop or a trace,
:mod:`specexp.workloads.arrivals`; a conversation's later turns once its earlier turns are answered:
:mod:`specexp.backends.turns`), and maps the engine's counters onto docs/design.md §4 and its per-row records
onto traces.parquet. Latencies count from arrival; ``queue_ms`` is arrival -> the first step that runs the
request (the wait for the next step, for a batch slot or for KV blocks)."""

from __future__ import annotations

from dataclasses import replace

import torch

from specexp.backends.server import BackendServer, target_tokenizer, warmup_limit
from specexp.backends.turns import TurnProgress, serve_by_turn
from specexp.engine.progress import ProgressCallback
from specexp.engine.request import Request
from specexp.engine.runner import EngineOutput, NativeEngine
from specexp.engine.stats import AcceptanceStats, request_latency
from specexp.engine_settings import engine_configs
from specexp.errors import ConfigError
from specexp.load_metrics import LoadSettings
from specexp.models import load_model, skinny_configs
from specexp.result import RequestOutput, RunResult, StepRecord, TraceRow, prompt_fields, run_metrics
from specexp.specs import RunSpec
from specexp.startup import PhaseClock, process_age_s, startup_record
from specexp.workloads.conversation import answer_text
from specexp.workloads.prompt import Prompt

WARMUP_NEW_TOKENS = 16  # run()'s warm-up request; the measurement layer's is measure.warmup_new_tokens
END_OF_REQUEST_RULE = ("native: output token 0 from the prefill, undrafted; each later step drafts "
                       "min(k, tokens left - 1)")


def run(spec: RunSpec, progress: ProgressCallback | None = None) -> RunResult:
    """Serve spec.prompts once with the native engine after one warm-up request; outputs, per-step rows and §4
    metrics. progress receives the CUDA-graph capture's events and the run's (not the warm-up's).
    Multi-turn conversations are served turn by turn (:func:`specexp.backends.turns.serve_by_turn`). The
    measurement layer uses :func:`open_server` instead, to serve several repeats on one engine."""
    with open_server(spec, progress) as server:
        server.warm_up(spec.prompts[:1], WARMUP_NEW_TOKENS)
        return server.serve(spec.prompts, progress)


def open_server(spec: RunSpec, progress: ProgressCallback | None = None) -> NativeServer:
    """Load the pair and build the engine (CUDA graphs captured, reporting to ``progress``) once, for any
    number of :meth:`NativeServer.serve` passes."""
    return NativeServer(spec, progress)


class NativeServer(BackendServer):
    """One engine for a whole measurement: :meth:`warm_up`, then :meth:`serve` once per repeat. Its start-up
    phases (model_load, engine_build, warmup) go into every pass's ``metrics.startup_s``."""

    def __init__(self, spec: RunSpec, progress: ProgressCallback | None = None, serve: list[RunSpec] = ()) -> None:
        """serve: the specs of every sweep point this server will serve (`retarget`), spec among them: the engine
        is built at their largest k (K) and max_model_len and captures each one's static k
        (`specexp.engine.reuse`); empty: spec alone."""
        engine_cfg, spec_cfg, sampling_cfg = engine_configs(spec)
        if serve:
            engine_cfg = replace(engine_cfg, max_model_len=max(s.engine.max_model_len for s in serve))
            spec_cfg = replace(spec_cfg, num_speculative_tokens=max(s.speculator.num_speculative_tokens
                                                                    for s in serve))
        # Checked already for every backend (specexp.engine_settings); kept for callers that skip the app layer.
        engine_cfg.validate()
        spec_cfg.validate(engine_cfg.max_model_len)
        sampling_cfg.validate()
        device = torch.device(engine_cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("engine.device=cuda but no CUDA GPU is visible: use engine.device=cpu")
        self.spec, self.device, self.k = spec, device, spec_cfg.num_speculative_tokens
        depths = sorted({s.speculator.num_speculative_tokens for s in serve})
        self.max_model_len, self.max_new_tokens = engine_cfg.max_model_len, sampling_cfg.max_new_tokens
        self.import_s, self.clock = process_age_s(), PhaseClock()
        load = {"dtype": spec.pair.dtype, "device": device, "seed": spec.pair.init_seed}
        target = load_model(spec.pair.target.path, weights=spec.pair.target.weights, **load)
        draft = load_model(spec.pair.draft.path, weights=spec.pair.draft.weights, **load) if self.k > 0 else None
        self.clock.lap("model_load")
        self.engine = NativeEngine(target, draft, engine_cfg, spec_cfg, sampling_cfg, target.config.eos_token_ids,
                                   progress=progress, serve_depths=depths)
        self.clock.lap("engine_build")
        self.tokenizer = target_tokenizer(spec)
        self.reused_by: int = 0  # later sweep points served by this engine (`retarget`)
        if serve:
            self.retarget(spec, first=True)

    def retarget(self, spec: RunSpec, first: bool = False) -> None:
        """Serve `spec` next, a sweep point of the engine's `serve` list: its static k, synthetic acceptance,
        seed, limits and workload; counters start again. Later points' start-up is their warm-up alone (the
        engine was built once)."""
        self._set_point(spec)
        self.engine.reseed(spec.engine.seed)
        self.engine.reset_counters()
        if not first:
            self.reused_by += 1
            self.import_s, self.clock = 0.0, PhaseClock()
            self.clock.phases_s.update(model_load=0.0, engine_build=0.0)

    def suspend(self) -> dict:
        """What the point being served needs to go on later exactly as if it had been alone (a sweep measuring
        in rounds serves other points in between): its spec, start-up clock, counters and random state."""
        return {"spec": self.spec, "clock": self.clock, "import_s": self.import_s, "reused_by": self.reused_by,
                "counters": self.engine.counter_state(), "rng": self.engine.rng_state()}

    def resume(self, state: dict) -> None:
        """Serve again the point `suspend` saved: its k, acceptance and limits, its counters and random state."""
        self._set_point(state["spec"])
        self.engine.restore_counters(state["counters"])
        self.engine.set_rng_state(state["rng"])
        self.clock, self.import_s, self.reused_by = state["clock"], state["import_s"], state["reused_by"]

    def _set_point(self, spec: RunSpec) -> None:
        """The engine runs `spec`'s static k and synthetic acceptance; this server its limits."""
        self.spec, self.k = spec, spec.speculator.num_speculative_tokens
        self.max_model_len, self.max_new_tokens = spec.engine.max_model_len, spec.sampling.max_new_tokens
        self.engine.use_static_depth(self.k)
        rate = spec.speculator.options.get("synthetic_acceptance_rate")
        if spec.speculator.options.get("rejection") == "synthetic" and rate is not None:
            self.engine.set_synthetic_acceptance(rate=float(rate))

    def warm_up(self, prompts: list[Prompt], max_new_tokens: int | None = None) -> None:
        """Serve ``prompts`` (their first turns, together, to ``max_new_tokens``, at most
        ``sampling.max_new_tokens``) and discard them."""
        if prompts:
            self.engine.generate([p.token_ids for p in prompts],
                                 max_new_tokens=warmup_limit(max_new_tokens, self.max_new_tokens))
        self.clock.lap("warmup")

    def serve(self, prompts: list[Prompt], progress: ProgressCallback | None = None) -> RunResult:
        """One measured pass: every prompt as its arrival process says (a conversation's later turns once its
        earlier turns are answered); outputs, per-step rows, traces and §4 metrics of this pass alone."""
        waves: list[EngineOutput] = []
        run_progress = TurnProgress(progress, prompts)
        engine, tokenizer, arrivals = self.engine, self.tokenizer, self.spec.arrivals

        def serve_wave(wave: list[Prompt]) -> list[Request]:
            # arrivals other than a burst are single-turn (checked by run_spec): the one wave is the whole run
            offsets = arrivals.offsets_s if arrivals is not None else None
            cap = arrivals.max_concurrency if arrivals is not None else None
            out = engine.generate([p.token_ids for p in wave], progress=run_progress.wave(), arrival_s=offsets,
                                  max_concurrency=cap)
            waves.append(out)
            run_progress.served(len(out.requests), sum(r.num_output_tokens for r in out.requests))
            return out.requests

        served = serve_by_turn(prompts, serve_wave, lambda req: answer_text(tokenizer, req.output_token_ids),
                               self.max_model_len, self.max_new_tokens,
                               bool(self.spec.workload.options.get("one_at_a_time", False)))
        run_progress.finish()
        result = to_run_result(served, waves, self.k, tokenizer, self.device, LoadSettings.of(self.spec))
        # the engine's whole capture phase (a reused engine's first point built every depth's graphs); a later
        # point of a reused engine: built, compiled and captured by an earlier one
        whole = self.engine.graph_capture or {}
        captured_s = whole.get("graph_capture_s") if not self.reused_by else 0.0
        compiled_s = whole.get("graph_compile_s") if not self.reused_by else 0.0
        result.metrics["startup_s"] = startup_record(self.clock.phases_s, self.import_s, captured_s, compiled_s)
        result.env["kernels_launched_early"] = self.engine.cfg.launches_early()  # engine.programmatic_launch
        if self.engine.cfg.linear_kernel == "triton_skinny":  # where its tiles came from
            result.env["skinny_tiles"] = skinny_configs.table_in_use(torch.device(self.engine.cfg.device))
        if self.engine.serve_depths:
            result.metrics["engine_reuse"] = {"engine_k": self.engine.k, "engine_max_model_len":
                                              self.engine.cfg.max_model_len, "served_before": self.reused_by,
                                              "depths": sorted(self.engine.serve_depths)}
        return result


def step_depth(step, static_k: int) -> int:
    """The speculation depth a step ran at: its own k (``EngineStep.num_speculative_tokens``), the run's static k
    where a step does not say."""
    k = getattr(step, "num_speculative_tokens", None)
    return static_k if k is None else k


def to_run_result(served: list[tuple[Prompt, Request]], waves: list[EngineOutput], k: int, tokenizer,
                  device: torch.device, load: LoadSettings | None = None) -> RunResult:
    """Map engine requests/steps onto RequestOutput/StepRecord/TraceRow and the §4 metrics. ``served``: every
    request with its prompt; ``waves``: the engine's output of each ``generate`` call, in order (steps are
    numbered across them; the run's duration is their sum); ``load``: the load metrics' settings."""
    acceptance = AcceptanceStats(k)
    requests = []
    end_of_wave = {id(req): out.total_s for out in waves for req in out.requests}
    for prompt, req in served:
        for num_drafts, num_accepted in req.verifies:
            acceptance.record(prompt.request_id, num_drafts, num_accepted)
        output_ids = req.output_token_ids
        end_s = req.finish_s if req.finish_s is not None else end_of_wave[id(req)]
        requests.append(RequestOutput(
            **prompt_fields(prompt),
            output_token_ids=output_ids, output_text=tokenizer.decode(output_ids) if tokenizer else "",
            accept_lengths=list(req.emitted_per_step),
            **request_latency(req.arrival_s, req.first_token_s if req.first_token_s is not None else end_s,
                              end_s, len(output_ids), scheduled_s=req.scheduled_s),
        ))
    out = waves[-1]
    engine_steps = [s for wave in waves for s in wave.steps]
    steps = [
        StepRecord(
            step=number, num_reqs=s.num_reqs, num_tokens=s.num_tokens, num_drafts=s.num_drafts,
            num_draft_tokens=s.num_draft_tokens, num_accepted_tokens=s.num_accepted_tokens,
            num_output_tokens=s.num_output_tokens, draft_ms=s.draft_ms, verify_ms=s.verify_ms,
            sample_ms=s.sample_ms, schedule_ms=s.schedule_ms, step_ms=s.step_ms,
            num_speculative_tokens=s.num_speculative_tokens,
            num_in_flight=s.num_in_flight, num_waiting=s.num_waiting,
        )
        for number, s in enumerate(engine_steps)
    ]
    traces = trace_rows(served, waves, engine_steps, k)
    graph = {}
    if device.type == "cuda":
        graph["persistent_buffer_bytes"] = out.persistent_buffer_bytes
    if out.graphs is not None:
        graph["graph_capture_bytes"] = out.graphs["graph_capture_bytes"]
        graph["graph_capture_s"] = out.graphs["graph_capture_s"]
        graph["graph_compile_s"] = out.graphs.get("graph_compile_s")
        graph["graph_capture_per_size"] = [
            record for manager in out.graphs["managers"].values() for record in manager["per_size"]
        ]
    env = {"device": str(device)}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    metrics = run_metrics(acceptance, requests, steps, sum(w.total_s for w in waves), graph, load)
    metrics["end_of_request_rule"] = END_OF_REQUEST_RULE
    metrics["adaptive_step_costs"] = out.step_costs
    if out.graphs is not None:
        metrics["graph_replays"] = {
            name: {"num_replays": m["num_replays"], "num_eager": m["num_eager"],
                   "num_eager_uncaptured": m["num_eager_uncaptured"]}
            for name, m in out.graphs["managers"].items()
        }
    return RunResult(requests, steps, metrics, env, traces)


def trace_rows(served: list[tuple[Prompt, Request]], waves: list[EngineOutput], engine_steps: list, k: int,
               ) -> list[TraceRow]:
    """One TraceRow per (request, step) that ran it, in request then step order; a wave's step indices are
    offset by the steps of the waves before it, as steps.parquet numbers them."""
    first_step, offset = {}, 0
    for wave in waves:
        for req in wave.requests:
            first_step[id(req)] = offset
        offset += len(wave.steps)
    rows = []
    for prompt, req in served:
        base = first_step[id(req)]
        for t in req.trace:
            step = engine_steps[base + t.step]
            rows.append(TraceRow(
                step=base + t.step, prompt_id=prompt.request_id, k=step_depth(step, k),
                num_query_tokens=t.num_query_tokens, is_prefill=t.is_prefill, num_draft_tokens=t.num_draft_tokens,
                num_accepted_tokens=t.num_accepted_tokens, num_emitted_tokens=t.num_emitted_tokens,
                num_reqs=step.num_reqs, step_ms=step.step_ms,
            ))
    return rows
