"""Backend ``vllm``: the same run on vLLM's own engine (``vllm.LLM``), draft-model speculation.

Needs vLLM on a CUDA machine: ``pip install -e '.[vllm]'`` with torch 2.11 (vLLM 0.26 is the newest release
built for it). On an offline GPU machine, ``../shared/gpu/fetch-vllm-wheels.sh DIR`` (run where PyPI is
reachable) downloads the wheels vLLM 0.26 needs beside an installed torch; then
``pip install --no-index --find-links DIR vllm==0.26.0``. vLLM is imported only by a server
(:func:`open_server`), so the rest of specexp, and this module's pure functions, work without it.

What maps where:
- :func:`llm_kwargs` / :func:`sampling_params_kwargs`: RunSpec -> ``vllm.LLM(...)`` / ``SamplingParams(...)``
  keywords (plain dicts; unit-tested without vLLM). ``engine.tensor_parallel_size`` and
  ``speculator.draft_tensor_parallel_size`` pass through under vLLM's names; with more than one GPU vLLM's
  workers capture the graphs in processes of their own, whose log is not read (graph metrics ``None``). Prompts go in as the target tokenizer's ids
  (``{"prompt_token_ids": ...}``); vLLM's own tokenizer is not loaded (``skip_tokenizer_init``) and output
  text is decoded with the target's tokenizer.json, as every backend does. EOS ids come from config.json /
  generation_config.json (the native loader's reading) as ``stop_token_ids``.
- Acceptance (docs/design.md §4) from ``LLM.get_metrics()`` counters, measured as the difference between
  snapshots before and after the measured ``generate`` (warm-up excluded): :func:`acceptance_from_vllm_metrics`.
  vLLM counts per (request, step) exactly as §4 does; it keeps no per-draft histogram, but with
  prefix acceptance ``histogram[j] = accepted_per_position[j-1] - accepted_per_position[j]`` is exact.
  Per-request acceptance (``acceptance_histogram_per_request`` is ``{}``), per-step rows (``steps`` is
  empty) and ``accept_lengths`` are not observable from outside vLLM.
- Latency from each request's ``RequestOutput.metrics`` (:func:`request_latency_from_vllm`; a closed loop's
  from its first scheduling, :mod:`specexp.backends.vllm_load`, which also maps arrivals and synthetic
  acceptance onto vLLM's keywords).
- Graph capture: vLLM logs ``Graph capturing finished in 1 secs, took 0.07 GiB`` (free device memory before
  vs after, to 0.01 GiB); :func:`parse_graph_capture_log` reads it from the ``vllm`` logger. Per-size
  figures are ``None``: vLLM logs only the total. The engine core runs in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set; backend option ``multiprocessing``) so that its log
  records reach the handler; with it in a subprocess the graph metrics are ``None``.
- A model that gets random weights (``pair.weights=random``, or ``auto`` on a config-only directory): the
  native backend's seeded weights (same seed, dtype, device) are written to a temporary safetensors
  checkpoint that vLLM loads, so all backends run the same models; it is deleted when the server closes.

vLLM does not give GPU memory back within a process (its allocator pools, CUDA graphs and the engine stay
until exit); the framework's sweep isolation already runs every sweep job in a fresh process.
``VLLM_USE_FLASHINFER_SAMPLER=0`` is set (unless already set) before vLLM is imported: the FlashInfer
sampler needs a JIT toolchain the GPU machines lack.

Backend options (``conf/backend/vllm.yaml``): ``gpu_memory_utilization`` (default 0.5),
``multiprocessing`` (default false), ``llm_kwargs`` (a dict merged last into ``LLM(...)``, for anything
else vLLM takes, e.g. ``compilation_config``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from specexp.backends import vllm_load
from specexp.backends.server import BackendServer, target_tokenizer, warmup_limit
from specexp.backends.turns import TurnProgress, serve_by_turn
from specexp.engine.progress import ProgressCallback
from specexp.engine.stats import AcceptanceCounts, AcceptanceStats, request_latency
from specexp.errors import ConfigError
from specexp.load_metrics import LoadSettings
from specexp.result import RequestOutput, RunResult, prompt_fields, run_metrics
from specexp.specs import ModelSpec, RunSpec
from specexp.startup import PhaseClock, process_age_s, startup_record
from specexp.workloads.conversation import answer_text

WARMUP_NEW_TOKENS = 16  # run()'s warm-up request; the measurement layer's is measure.warmup_new_tokens
END_OF_REQUEST_RULE = ("vllm: output token 0 from the prefill; every later step drafts k, and tokens "
                       "accepted past max_tokens are counted")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.5
INSTALL_HINT = "pip install -e '.[vllm]' on a GPU machine with torch 2.11"
GIB = 1 << 30

NUM_DRAFTS = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

_GRAPH_LOG = re.compile(
    r"Graph capturing finished in\s+([0-9.]+)\s*secs?(?:,\s*took\s+(-?[0-9.]+)\s*GiB)?", re.IGNORECASE
)


# ------------------------------------------------------------------------------------ spec -> vLLM kwargs


def llm_kwargs(spec: RunSpec, target_dir: str | None = None, draft_dir: str | None = None,
               max_positions: int | None = None) -> dict[str, Any]:
    """``vllm.LLM(**kwargs)`` for ``spec``. ``target_dir``/``draft_dir`` replace the pair's paths (random
    weights are materialised elsewhere); at k = 0 there is no ``speculative_config``. ``max_positions``
    (the target's ``max_position_embeddings``) caps ``max_model_len``: vLLM refuses a longer one, while
    ``engine.max_model_len`` is a budget that prompts were already checked against."""
    e, s, options = spec.engine, spec.speculator, spec.backend_options
    target = target_dir or spec.pair.target.path
    kwargs: dict[str, Any] = {
        "model": target,
        "tokenizer": target,
        "skip_tokenizer_init": True,
        "dtype": spec.pair.dtype,
        "seed": e.seed,
        "max_num_seqs": vllm_load.max_num_seqs(spec),
        "max_model_len": min(e.max_model_len, max_positions) if max_positions else e.max_model_len,
        "enforce_eager": e.cudagraph_mode == "none",
        "gpu_memory_utilization": float(options.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)),
        "disable_log_stats": False,
        "tensor_parallel_size": int(e.options.get("tensor_parallel_size") or 1),
    }
    if "max_num_batched_tokens" in e.options:
        kwargs["max_num_batched_tokens"] = e.options["max_num_batched_tokens"]
    k = s.num_speculative_tokens
    if k > 0:
        kwargs["speculative_config"] = {
            "method": "draft_model",
            "model": draft_dir or spec.pair.draft.path,
            "num_speculative_tokens": k,
            # the draft is eager when its own mode says so, or when the whole engine is eager
            "enforce_eager": s.draft_graph_mode(e.cudagraph_mode) == "none",
            **vllm_load.synthetic_speculative_config(spec),
        }
        if s.options.get("draft_tensor_parallel_size") is not None:  # unset: vLLM gives the draft the target's
            kwargs["speculative_config"]["draft_tensor_parallel_size"] = int(s.options["draft_tensor_parallel_size"])
    kwargs.update(options.get("llm_kwargs") or {})
    return kwargs


def sampling_params_kwargs(spec: RunSpec, request_index: int = 0,
                           eos_token_ids: list[int] | tuple[int, ...] = ()) -> dict[str, Any]:
    """``vllm.SamplingParams(**kwargs)`` for the ``request_index``-th prompt of ``spec``.

    Temperature 0 is greedy (no top-p/top-k, no seed). Sampling seeds each request with
    ``engine.seed + request_index`` so identical prompts do not draw identical outputs. specexp's
    ``top_k = 0`` (off) is vLLM's ``-1``. ``eos_token_ids`` become ``stop_token_ids`` unless
    ``ignore_eos`` (vLLM's tokenizer, which would know EOS, is not loaded).
    """
    sp = spec.sampling
    kwargs: dict[str, Any] = {
        "max_tokens": sp.max_new_tokens,
        "ignore_eos": sp.ignore_eos,
        "detokenize": False,
        "temperature": float(sp.temperature),
    }
    if sp.temperature > 0:
        kwargs["top_p"] = float(sp.top_p)
        kwargs["top_k"] = int(sp.top_k) if sp.top_k > 0 else -1
        kwargs["seed"] = spec.engine.seed + request_index
    if not sp.ignore_eos and eos_token_ids:
        kwargs["stop_token_ids"] = list(eos_token_ids)
    return kwargs


# ------------------------------------------------------------------------------------------- metrics


def _metric_value(metric) -> int | list[int] | None:
    values = getattr(metric, "values", None)
    if values is not None:
        return [int(v) for v in values]
    value = getattr(metric, "value", None)
    return int(value) if value is not None else None


def spec_decode_counters(metrics_list) -> dict[str, Any]:
    """The four spec-decode counters of a ``LLM.get_metrics()`` snapshot, summed over label sets (one per
    engine): ``{name: int}`` and ``{ACCEPTED_PER_POS: list[int]}``; absent counters are absent."""
    wanted = (NUM_DRAFTS, NUM_DRAFT_TOKENS, NUM_ACCEPTED_TOKENS, ACCEPTED_PER_POS)
    totals: dict[str, Any] = {}
    for metric in metrics_list or []:
        name = getattr(metric, "name", "")
        name = name.removesuffix("_total")
        if name not in wanted:
            continue
        value = _metric_value(metric)
        if value is None:
            continue
        if isinstance(value, list):
            current = totals.setdefault(name, [])
            current.extend([0] * (len(value) - len(current)))
            for i, v in enumerate(value):
                current[i] += v
        else:
            totals[name] = totals.get(name, 0) + value
    return totals


def acceptance_counts_from_vllm(metrics_list, k: int, before=None) -> AcceptanceCounts:
    """§4 counts from vLLM's counters (after minus ``before``, both ``LLM.get_metrics()`` snapshots).

    ``accepted_per_position[i]``: drafts whose positions 0..i were all accepted (vLLM's per-position counter,
    the same prefix count). ``acceptance_histogram[j] = accepted[j-1] - accepted[j]`` with ``accepted[-1] =
    num_drafts`` and ``accepted[k] = 0``. ``drafted_per_position`` is ``[num_drafts] * k``: vLLM proposes k
    tokens a step (:func:`acceptance_from_vllm_metrics` counts the exceptions).
    """
    after, base = spec_decode_counters(metrics_list), spec_decode_counters(before)

    def delta(name: str) -> int:
        return after.get(name, 0) - base.get(name, 0)

    per_pos_after, per_pos_before = after.get(ACCEPTED_PER_POS, []), base.get(ACCEPTED_PER_POS, [])
    accepted = [
        (per_pos_after[i] if i < len(per_pos_after) else 0) - (per_pos_before[i] if i < len(per_pos_before) else 0)
        for i in range(k)
    ]
    num_drafts = delta(NUM_DRAFTS)
    bounds = [num_drafts, *accepted, 0]
    histogram = [bounds[j] - bounds[j + 1] for j in range(k + 1)]
    return AcceptanceCounts(
        num_speculative_tokens=k,
        num_drafts=num_drafts,
        num_draft_tokens=delta(NUM_DRAFT_TOKENS),
        num_accepted_tokens=delta(NUM_ACCEPTED_TOKENS),
        drafted_per_position=[num_drafts] * k,
        accepted_per_position=accepted,
        acceptance_histogram=histogram,
        acceptance_histogram_by_draft_length=[[0] * (d + 1) for d in range(k)] + [histogram],
    )


def acceptance_from_vllm_metrics(metrics_list, k: int, before=None) -> dict[str, Any]:
    """The §4 acceptance metrics of a vLLM run (see :func:`acceptance_counts_from_vllm`), plus
    ``vllm_missing_draft_tokens = k * num_drafts - num_draft_tokens``: draft tokens vLLM left out of
    shortened drafts (0 when every draft carried k, the case where ``drafted_per_position`` is exact; vLLM
    does not say which positions a short draft lacked)."""
    counts = acceptance_counts_from_vllm(metrics_list, k, before)
    return {**counts.metrics(), "vllm_missing_draft_tokens": k * counts.num_drafts - counts.num_draft_tokens}


def request_latency_from_vllm(metrics, num_output_tokens: int) -> dict[str, float | None]:
    """``ttft_ms``/``tpot_ms``/``e2e_ms``/``queue_ms`` of one request from its ``RequestOutput.metrics``
    (``None`` each where the fields are missing; their names differ by vLLM version). As on every backend,
    latencies count from arrival and ``queue_ms`` is arrival -> first scheduled.

    - V1 ``RequestStateStats``: ``first_token_latency`` (s, frontend: arrival -> first token) and the engine
      core's monotonic ``queued_ts``/``scheduled_ts``/``first_token_ts``/``last_token_ts``:
      e2e = ttft + (last - first), queue = scheduled - queued.
    - V0 ``RequestMetrics``: wall-clock ``arrival_time``, ``first_scheduled_time``, ``first_token_time``,
      ``finished_time`` / ``last_token_time``.
    Timestamps equal to 0 mean "never set".
    """
    none = {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None, "queue_ms": None}
    if metrics is None:
        return none

    def field(name: str) -> float | None:
        value = getattr(metrics, name, None)
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    ttft_s = field("first_token_latency")
    if ttft_s is not None:
        queued, scheduled = field("queued_ts"), field("scheduled_ts")
        queue_ms = (scheduled - queued) * 1e3 if queued is not None and scheduled is not None else None
        first, last = field("first_token_ts"), field("last_token_ts")
        if first is None or last is None:
            return {**none, "ttft_ms": ttft_s * 1e3, "queue_ms": queue_ms}
        return {**request_latency(0.0, ttft_s, ttft_s + (last - first), num_output_tokens), "queue_ms": queue_ms}
    arrival, first = field("arrival_time"), field("first_token_time")
    end = field("finished_time") or field("last_token_time")
    if arrival is None or first is None:
        return none
    scheduled = field("first_scheduled_time")
    if end is None:
        queue_ms = (scheduled - arrival) * 1e3 if scheduled is not None else None
        return {**none, "ttft_ms": (first - arrival) * 1e3, "queue_ms": queue_ms}
    return request_latency(arrival, first, end, num_output_tokens, scheduled_s=scheduled)


def parse_graph_capture_log(text: str) -> tuple[float, int | None] | None:
    """``(seconds, bytes)`` summed over vLLM's ``Graph capturing finished in N secs, took X GiB`` lines in
    ``text``; ``bytes`` is ``None`` when no line states the memory (older vLLM), the result ``None`` when
    there is no such line (eager run). The log rounds to 1 s and 0.01 GiB."""
    matches = _GRAPH_LOG.findall(text or "")
    if not matches:
        return None
    seconds = sum(float(s) for s, _ in matches)
    gib = [float(g) for _, g in matches if g]
    return seconds, (round(sum(gib) * GIB) if gib else None)


class LogCapture(logging.Handler):
    """Keeps every record that reaches the ``vllm`` logger (vLLM's loggers do not propagate to root)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record must not break the run
            message = str(record.msg)
        self.lines.append(f"{record.levelname} {record.name}: {message}")

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @contextlib.contextmanager
    def attached(self, logger_name: str = "vllm"):
        """Within this block, records of ``logger_name`` and its children from INFO up are kept."""
        logger = logging.getLogger(logger_name)
        level = logger.level
        if logger.getEffectiveLevel() > logging.INFO:  # VLLM_CONFIGURE_LOGGING=0 leaves it at root's level
            logger.setLevel(logging.INFO)
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)


# -------------------------------------------------------------------------------- random -> checkpoint


def materialize_random_weights(model: ModelSpec, spec: RunSpec, dest: Path, device: str = "cpu") -> str:
    """Write the native backend's seeded random weights of ``model`` (``pair.init_seed``, ``pair.dtype``,
    drawn on ``device``) as ``dest/model.safetensors`` beside copies of its config.json, generation_config.json
    and tokenizer.json; returns ``dest``. State-dict keys are HF's; a tied ``lm_head.weight`` is left out, as
    HF checkpoints do."""
    import torch
    from safetensors.torch import save_file

    from specexp.models import load_model

    dest.mkdir(parents=True, exist_ok=True)
    native = load_model(model.path, dtype=spec.pair.dtype, device=device, weights="random",
                        seed=spec.pair.init_seed)
    state = native.state_dict()
    config = json.loads((Path(model.path) / "config.json").read_text())
    tied = config.get("tie_word_embeddings", config.get("tie_embedding", False))
    embed = state.get("model.embed_tokens.weight")
    head = state.get("lm_head.weight")
    if tied and head is not None and embed is not None and head.data_ptr() == embed.data_ptr():
        del state["lm_head.weight"]
    save_file({name: t.detach().to("cpu").contiguous().clone() for name, t in state.items()},
              str(dest / "model.safetensors"), metadata={"format": "pt"})
    del native, state
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        source = Path(model.path) / name
        if source.is_file():
            shutil.copy(source, dest / name)
    return str(dest)


# ---------------------------------------------------------------------------------------------- run


def _import_vllm():
    """``vllm`` (with ``VLLM_USE_FLASHINFER_SAMPLER=0``), or a one-line ConfigError saying how to get it."""
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(f"backend vllm needs the 'vllm' package, which is not installed: {INSTALL_HINT}") from e
    return vllm


def check_available(spec: RunSpec):
    """vLLM importable, a CUDA GPU visible and ``engine.device=cuda``; returns the ``vllm`` module."""
    vllm = _import_vllm()
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"backend vllm needs a CUDA GPU and none is visible: run it on a GPU machine ({INSTALL_HINT})")
    if spec.engine.device != "cuda":
        raise ConfigError(f"backend vllm runs on CUDA only, engine.device={spec.engine.device}: use engine=cuda")
    return vllm


def run(spec: RunSpec, progress: ProgressCallback | None = None) -> RunResult:
    """One warm-up request, then one :meth:`VllmServer.serve` pass over ``spec.prompts``; outputs and §4
    metrics (the measurement layer uses :func:`open_server`, for several repeats)."""
    with open_server(spec) as server:
        server.warm_up(spec.prompts[:1], WARMUP_NEW_TOKENS)
        return server.serve(spec.prompts, progress)


def open_server(spec: RunSpec, progress: ProgressCallback | None = None) -> VllmServer:
    """``vllm.LLM`` built once, for several :meth:`VllmServer.serve` passes (``progress`` unused)."""
    return VllmServer(spec)


class VllmServer(BackendServer):
    """One ``vllm.LLM`` for a whole measurement: :meth:`warm_up`, then :meth:`serve` once per repeat;
    :meth:`close` writes vllm.log and deletes a materialised checkpoint."""

    def __init__(self, spec: RunSpec) -> None:
        if not spec.backend_options.get("multiprocessing", False):
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.vllm = vllm = check_available(spec)

        from specexp.models import load_config

        self.spec, self.k = spec, spec.speculator.num_speculative_tokens
        self.import_s, self.clock = process_age_s(), PhaseClock()
        self.target_config = load_config(spec.pair.target.path)
        self.log = LogCapture()
        random_draft = self.k > 0 and spec.pair.draft.weights == "random"
        needs_scratch = spec.pair.target.weights == "random" or random_draft
        self.scratch = Path(tempfile.mkdtemp(prefix="specexp-vllm-")) if needs_scratch else None
        self._attached = contextlib.ExitStack()
        try:
            target_dir = draft_dir = None
            if spec.pair.target.weights == "random":
                target_dir = materialize_random_weights(spec.pair.target, spec, self.scratch / "target",
                                                        spec.engine.device)
            if random_draft:
                draft_dir = materialize_random_weights(spec.pair.draft, spec, self.scratch / "draft",
                                                       spec.engine.device)
            self._attached.enter_context(self.log.attached())
            self.llm = vllm.LLM(**llm_kwargs(spec, target_dir, draft_dir, self.target_config.max_position_embeddings))
            self.clock.lap("model_load_and_engine_build")  # vLLM builds both in LLM(...)
        except BaseException:
            self.close()
            raise
        self.tokenizer = target_tokenizer(spec)

    def close(self) -> None:
        """Stop capturing vLLM's log, write it as vllm.log, delete the scratch checkpoint."""
        self._attached.close()
        _write_log(self.spec, self.log)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def warm_up(self, prompts: list, max_new_tokens: int | None = None) -> None:
        """Generate ``prompts`` (first turns, together, to ``max_new_tokens``, at most
        ``sampling.max_new_tokens``) and discard them."""
        if prompts:
            limit = warmup_limit(max_new_tokens, self.spec.sampling.max_new_tokens)
            kwargs = {**sampling_params_kwargs(self.spec, 0, self.target_config.eos_token_ids), "max_tokens": limit}
            self.llm.generate([{"prompt_token_ids": list(p.token_ids)} for p in prompts],
                              self.vllm.SamplingParams(**kwargs), use_tqdm=False)
        self.clock.lap("warmup")

    def serve(self, prompts: list, progress: ProgressCallback | None = None) -> RunResult:
        """One measured pass over ``prompts`` (all arriving together; a conversation's later turns once its
        earlier turns are answered): outputs and §4 metrics, acceptance from vLLM's counters before and after.
        ``progress``: a RUN event as the requests are submitted and one when each ``generate`` call is done."""
        spec, llm, vllm, tokenizer, k = self.spec, self.llm, self.vllm, self.tokenizer, self.k
        eos = self.target_config.eos_token_ids
        before = llm.get_metrics()
        order = {p.id: i for i, p in enumerate(prompts)}  # a conversation's turns share its seed index
        duration_s = 0.0
        run_progress = TurnProgress(progress, prompts)
        run_progress.start()

        def serve_wave(wave: list) -> list:
            nonlocal duration_s
            batch = [{"prompt_token_ids": list(p.token_ids)} for p in wave]
            params = [vllm.SamplingParams(**sampling_params_kwargs(spec, order[p.id] + (p.turn - 1) * len(order), eos))
                      for p in wave]
            start = time.perf_counter()
            outputs = llm.generate(batch, params, use_tqdm=False)
            duration_s += time.perf_counter() - start
            run_progress.served(len(outputs), sum(len(out.outputs[0].token_ids) for out in outputs), report=True)
            return outputs

        served = serve_by_turn(prompts, serve_wave, lambda out: answer_text(tokenizer, list(out.outputs[0].token_ids)),
                               spec.engine.max_model_len, spec.sampling.max_new_tokens,
                               bool(spec.workload.options.get("one_at_a_time", False)))
        after = llm.get_metrics()
        run_progress.finish()
        latency_of = vllm_load.closed_loop_latency if vllm_load.closed_loop(spec) else request_latency_from_vllm
        requests = []
        for prompt, out in served:
            output_ids = list(out.outputs[0].token_ids)
            requests.append(RequestOutput(
                **prompt_fields(prompt),
                output_token_ids=output_ids, output_text=tokenizer.decode(output_ids) if tokenizer else "",
                **latency_of(getattr(out, "metrics", None), len(output_ids)),
            ))
        acceptance = AcceptanceStats(k)
        acceptance.total = acceptance_counts_from_vllm(after, k, before)
        capture = parse_graph_capture_log(self.log.text)
        graph = {"graph_capture_s": capture[0], "graph_capture_bytes": capture[1]} if capture else {}
        metrics = run_metrics(acceptance, requests, [], duration_s, graph,
                              LoadSettings.of(spec, max_num_seqs=vllm_load.max_num_seqs(spec)))
        metrics.update(acceptance_from_vllm_metrics(after, k, before))  # acceptance_histogram_per_request: {}
        metrics["end_of_request_rule"] = END_OF_REQUEST_RULE
        metrics["startup_s"] = startup_record(self.clock.phases_s, self.import_s, graph.get("graph_capture_s"))
        import torch

        env = {"device": "cuda:0", "gpu": torch.cuda.get_device_name(0), "vllm": getattr(vllm, "__version__", None),
               "tensor_parallel_size": int(spec.engine.options.get("tensor_parallel_size") or 1)}
        return RunResult(requests, [], metrics, env)


def _write_log(spec: RunSpec, log: LogCapture) -> None:
    """vLLM's own log of the run, as ``vllm.log`` in the run directory (exact messages for reports)."""
    if not spec.output_dir or not log.lines:
        return
    with contextlib.suppress(OSError):
        Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(spec.output_dir) / "vllm.log").write_text(log.text + "\n")
