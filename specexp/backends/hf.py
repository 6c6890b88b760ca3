"""Backend ``hf``: Hugging Face transformers assisted generation, the baseline every backend is compared to.

One request at a time (assisted generation's limit: batch size 1), greedy or sampling; k = 0 is plain
``generate``. Acceptance is **counted**, not estimated: the target's candidate generator is wrapped so each
verification reports ``(num_draft_tokens, num_accepted_tokens)`` to :class:`AcceptanceStats`, and forward
hooks on the target time every verification.

Traps in transformers 5.20 handled here:
- ``num_assistant_tokens`` passed to ``generate()`` is silently ignored; it is read from the *draft's*
  ``generation_config`` (set there, with ``num_assistant_tokens_schedule="constant"``).
- ``assistant_confidence_threshold`` (default 0.4) stops drafting early when the draft is unsure; it is set
  to 0 so every step proposes exactly k tokens (fewer only where ``max_new_tokens`` leaves less room).
- ``ignore_eos`` is done by clearing ``eos_token_id`` on both models' generation configs (so the draft never
  stops early at EOS either), not by suppressing the EOS logit, which would change the distribution.
Graph metrics are ``None`` (no CUDA graphs here).

Latencies are measured as on the native engine: every prompt arrives when the measured run starts, so
``ttft_ms`` and ``e2e_ms`` count from that moment and ``queue_ms`` is the wait for the requests served
before it (assisted generation serves one at a time).
"""

from __future__ import annotations

import contextlib
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer
from transformers.utils import logging as hf_logging

from specexp.backends.server import BackendServer, target_tokenizer, warmup_limit
from specexp.backends.turns import TurnProgress, serve_by_turn
from specexp.engine.progress import ProgressCallback
from specexp.engine.stats import AcceptanceStats, request_latency
from specexp.models import load_model as load_native_model
from specexp.result import RequestOutput, RunResult, StepRecord, prompt_fields, run_metrics
from specexp.specs import ModelSpec, RunSpec
from specexp.startup import PhaseClock, process_age_s, startup_record
from specexp.workloads.conversation import answer_text
from specexp.workloads.prompt import Prompt

WARMUP_NEW_TOKENS = 16  # run()'s warm-up request; the measurement layer's is measure.warmup_new_tokens
END_OF_REQUEST_RULE = ("hf: output token 0 is speculated too (no prefill sample); drafts are trimmed to "
                       "the tokens left, as native's")


def run(spec: RunSpec, progress: ProgressCallback | None = None) -> RunResult:
    """Generate every prompt of ``spec`` one at a time (a conversation's turns in order), after one warm-up
    request, and return outputs, step rows and §4 metrics. ``progress`` receives a RUN event before the first
    request and after each. The measurement layer uses :func:`open_server` to serve several repeats."""
    with open_server(spec) as server:
        server.warm_up(spec.prompts[:1], WARMUP_NEW_TOKENS)
        return server.serve(spec.prompts, progress)


def open_server(spec: RunSpec, progress: ProgressCallback | None = None) -> HfServer:
    """Load both models and configure generation once, for any number of :meth:`HfServer.serve` passes
    (``progress`` is unused here: loading reports nothing)."""
    return HfServer(spec)


class HfServer(BackendServer):
    """Both models, loaded once: :meth:`warm_up`, then :meth:`serve` once per repeat. Sampling is seeded with
    ``engine.seed`` before the first measured pass; later passes draw on from there."""

    def __init__(self, spec: RunSpec) -> None:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.spec = spec
        self.device = torch.device(spec.engine.device)
        self.k = spec.speculator.num_speculative_tokens
        self.import_s, self.clock = process_age_s(), PhaseClock()
        self.target = load_model(spec.pair.target, spec, self.device)
        self.draft = load_model(spec.pair.draft, spec, self.device) if self.k > 0 else None
        configure_generation(self.target, self.draft, spec)
        self.clock.lap("model_load")
        self.tokenizer = target_tokenizer(spec)
        self.probe = GenerationProbe(self.target, AcceptanceStats(self.k), sync=self.device.type == "cuda")
        self.seeded = False

    def close(self) -> None:
        """Take the probe's hooks off the target."""
        self.probe.remove()

    def warm_up(self, prompts: list[Prompt], max_new_tokens: int | None = None) -> None:
        """Generate ``prompts`` (first turns, one at a time, to ``max_new_tokens``, at most
        ``sampling.max_new_tokens``) untimed and uncounted."""
        limit = warmup_limit(max_new_tokens, self.spec.sampling.max_new_tokens)
        with self.probe.paused():
            for prompt in prompts:
                self.probe.begin_request(prompt.id)
                _generate(self.target, self.draft, prompt.token_ids, limit, self.device, self.probe)
        self.clock.lap("warmup")

    def serve(self, prompts: list[Prompt], progress: ProgressCallback | None = None) -> RunResult:
        """One measured pass over ``prompts``: outputs, step rows and §4 metrics of this pass alone."""
        spec, probe, tokenizer = self.spec, self.probe, self.tokenizer
        target, draft, device = self.target, self.draft, self.device
        acceptance = AcceptanceStats(self.k)
        probe.acceptance, probe.steps = acceptance, []
        if not self.seeded:
            torch.manual_seed(spec.engine.seed)
            self.seeded = True
        run_start = time.perf_counter()  # every first turn's arrival (a later turn arrives when it is created)
        run_progress = TurnProgress(progress, prompts)
        run_progress.start()

        def serve_one(wave: list[Prompt]) -> list[RequestOutput]:
            (prompt,) = wave
            probe.begin_request(prompt.request_id)
            start = time.perf_counter()
            output_ids = _generate(target, draft, prompt.token_ids, spec.sampling.max_new_tokens, device, probe)
            end = time.perf_counter()
            run_progress.served(1, len(output_ids), report=True)
            return [RequestOutput(
                **prompt_fields(prompt),
                output_token_ids=output_ids,
                output_text=tokenizer.decode(output_ids) if tokenizer is not None else "",
                accept_lengths=probe.request_accept_lengths(),
                **request_latency(run_start if prompt.turn == 1 else start, probe.first_token_s or end, end,
                                  len(output_ids), scheduled_s=start),
            )]

        # One request at a time, conversation by conversation (a later turn quotes the earlier answers).
        served = serve_by_turn(prompts, serve_one, lambda r: answer_text(tokenizer, r.output_token_ids),
                               spec.engine.max_model_len, spec.sampling.max_new_tokens, one_at_a_time=True)
        requests = [request for _, request in served]
        run_progress.finish()
        duration_s = time.perf_counter() - run_start
        env = {"device": str(device)}
        if device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name(device)
        metrics = run_metrics(acceptance, requests, probe.steps, duration_s)
        metrics["end_of_request_rule"] = END_OF_REQUEST_RULE
        metrics["startup_s"] = startup_record(self.clock.phases_s, self.import_s)
        return RunResult(requests, probe.steps, metrics, env)


def load_model(model: ModelSpec, spec: RunSpec, device: torch.device):
    """The model at ``model.path`` in ``spec.pair.dtype`` on ``device``, in eval mode; where it gets random
    weights (``model.weights``) a seeded (``pair.init_seed``) random init of its config.json."""
    dtype = getattr(torch, spec.pair.dtype)
    if model.weights == "random":
        # The very weights the native backend draws for this pair (same seed, dtype and device), so that
        # backends compared on a random pair run the same models.
        native = load_native_model(model.path, dtype=dtype, device=device, weights="random",
                                   seed=spec.pair.init_seed)
        loaded = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model.path), dtype=dtype).to(device)
        loaded.load_state_dict(native.state_dict(), strict=True)
        del native
    else:
        loaded = AutoModelForCausalLM.from_pretrained(model.path, dtype=dtype)
    return loaded.to(device).eval()


def configure_generation(target, draft, spec: RunSpec) -> None:
    """Set sampling, EOS and the draft's constant k-token schedule on the models' generation configs."""
    sampling = spec.sampling
    for model in (target, draft):
        if model is None:
            continue
        config = model.generation_config
        config.do_sample = sampling.temperature > 0
        config.temperature = sampling.temperature if sampling.temperature > 0 else None
        config.top_k = sampling.top_k if sampling.temperature > 0 else None
        config.top_p = sampling.top_p if sampling.temperature > 0 else None
        if config.pad_token_id is None:
            config.pad_token_id = config.eos_token_id if isinstance(config.eos_token_id, int) else 0
        if sampling.ignore_eos:
            config.eos_token_id = None
    if draft is not None:
        draft.generation_config.num_assistant_tokens = spec.speculator.num_speculative_tokens
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0


def _generate(target, draft, token_ids, max_new_tokens: int, device, probe: GenerationProbe) -> list[int]:
    input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
    with torch.inference_mode():
        out = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            assistant_model=draft,
            streamer=probe.streamer(),
        )
    return out[0, input_ids.shape[1]:].tolist()


class GenerationProbe:
    """Watches ``target.generate``: times draft proposals and target forwards, counts each verification.

    Events of one step, in order: the candidate generator's ``get_candidates`` (drafting), the target's
    forward (verification), the streamer's ``put`` (tokens emitted), then — with a draft —
    ``update_candidate_strategy(num_matches)``, which closes the step. Without a draft the ``put`` closes it.
    """

    def __init__(self, target, acceptance: AcceptanceStats, sync: bool) -> None:
        self.acceptance = acceptance
        self.sync = sync
        self.enabled = True
        self.steps: list[StepRecord] = []
        self.request_id: str | None = None
        self.first_token_s: float | None = None
        self._request_steps: list[StepRecord] = []
        self._assisted = False
        self._step_start: float | None = None
        self._draft_ms: float | None = None
        self._forward: dict = {}
        self._handles = [
            target.register_forward_pre_hook(self._before_forward, with_kwargs=True),
            target.register_forward_hook(self._after_forward),
        ]
        self._original_get_candidate_generator = target._get_candidate_generator
        self._target = target
        target._get_candidate_generator = self._get_candidate_generator

    # -- life cycle ------------------------------------------------------------------------------------
    def begin_request(self, request_id: str) -> None:
        self.request_id = request_id
        self.first_token_s = None
        self._request_steps = []
        self._assisted = False
        self._forward, self._step_start, self._draft_ms = {}, None, None

    def request_accept_lengths(self) -> list[int]:
        return [s.num_output_tokens for s in self._request_steps]

    @contextlib.contextmanager
    def paused(self):
        """Within this block nothing is timed or counted (warm-up)."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._target._get_candidate_generator = self._original_get_candidate_generator

    def streamer(self) -> BaseStreamer:
        """A fresh streamer for one ``generate`` call that reports emitted tokens to this probe."""
        return _ProbeStreamer(self)

    # -- events -----------------------------------------------------------------------------------------
    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _get_candidate_generator(self, *args, **kwargs):
        generator = self._original_get_candidate_generator(*args, **kwargs)
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

        def timed_get_candidates(*a, **kw):
            start = self._now()
            out = get_candidates(*a, **kw)
            self._step_start, self._draft_ms = start, (self._now() - start) * 1e3
            return out

        def counted_update(input_ids, scores, num_matches):
            # scores: [1, num_draft_tokens + 1, vocab]; num_matches: accepted drafts after EOS/length crops.
            self._close_step(num_draft_tokens=scores.shape[1] - 1, num_accepted_tokens=int(num_matches))
            return update(input_ids, scores, num_matches)

        generator.get_candidates = timed_get_candidates
        generator.update_candidate_strategy = counted_update
        self._assisted = True
        return generator

    def _before_forward(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        num_tokens = int(input_ids.shape[1]) if input_ids is not None else 0
        self._forward = {"start": self._now(), "num_tokens": num_tokens}
        if self._step_start is None:
            self._step_start = self._forward["start"]

    def _after_forward(self, module, args, output):
        self._forward["end"] = self._now()

    def _tokens_emitted(self, num_tokens: int) -> None:
        now = time.perf_counter()
        if self.first_token_s is None and self.enabled:
            self.first_token_s = now
        self._forward["emitted"] = num_tokens
        if not self._assisted:
            self._close_step(num_draft_tokens=0, num_accepted_tokens=0)

    def _close_step(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        end = self._now()
        forward = self._forward
        if self.enabled:
            self.acceptance.record(self.request_id, num_draft_tokens, num_accepted_tokens)
            step = StepRecord(
                step=len(self.steps),
                num_reqs=1,
                num_tokens=forward.get("num_tokens", 0),
                num_drafts=int(num_draft_tokens > 0),
                num_draft_tokens=num_draft_tokens,
                num_accepted_tokens=num_accepted_tokens,
                num_output_tokens=forward.get("emitted", 0),
                draft_ms=self._draft_ms,
                verify_ms=(forward["end"] - forward["start"]) * 1e3 if "end" in forward else None,
                sample_ms=(end - forward["end"]) * 1e3 if "end" in forward else None,
                step_ms=(end - self._step_start) * 1e3 if self._step_start is not None else None,
                request_id=self.request_id,
            )
            self.steps.append(step)
            self._request_steps.append(step)
        self._forward, self._step_start, self._draft_ms = {}, None, None


class _ProbeStreamer(BaseStreamer):
    """Reports each ``put`` after the first (``generate`` first puts the prompt itself) to the probe."""

    def __init__(self, probe: GenerationProbe) -> None:
        self.probe = probe
        self.prompt_seen = False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.probe._tokens_emitted(int(value.numel()))
        self.prompt_seen = True

    def end(self) -> None:
        pass
