"""Backend vllm, the parts that need neither vLLM nor a GPU: spec -> vLLM keywords, vLLM's counters -> §4
metrics, request timings -> latency, the graph-capture log line, random weights -> a checkpoint vLLM can
load, and the one-line error where vLLM is missing."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch

from specexp.backends import get_backend
from specexp.backends import vllm as backend
from specexp.errors import ConfigError
from specexp.specs import (
    EngineSpec,
    ModelSpec,
    PairSpec,
    RunSpec,
    SamplingSpec,
    ShortConvSpec,
    SpeculatorSpec,
    WorkloadSpec,
)
from specexp.workloads.prompt import Prompt


@pytest.fixture(autouse=True)
def _vllm_environment(monkeypatch):
    """run() sets vLLM's environment switches; each test starts without them and leaves none behind."""
    for name in ("VLLM_USE_FLASHINFER_SAMPLER", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def make_spec(k: int = 0, temperature: float = 0.0, engine_graphs: str = "full", draft_graphs: str | None = "full",
              top_k: int = 0, ignore_eos: bool = False, weights: str = "trained", target: str = "/m/target",
              draft: str = "/m/draft", backend_options: dict | None = None, output_dir: str = "") -> RunSpec:
    def model(path: str) -> ModelSpec:
        return ModelSpec(path=path, source=path, architecture="LlamaForCausalLM", vocab_size=512,
                         weights="random" if weights == "random" else "trained")

    return RunSpec(
        experiment="test", backend="vllm",
        pair=PairSpec(name="p", target=model(target), draft=model(draft), weights=weights, dtype="bfloat16",
                      init_seed=3),
        speculator=SpeculatorSpec(num_speculative_tokens=k, cudagraph_mode=draft_graphs),
        short_conv=ShortConvSpec(),
        engine=EngineSpec(device="cuda", max_num_seqs=16, max_model_len=1024, cudagraph_mode=engine_graphs,
                          seed=7),
        sampling=SamplingSpec(temperature=temperature, max_new_tokens=32, ignore_eos=ignore_eos, top_p=0.9,
                              top_k=top_k),
        workload=WorkloadSpec(name="random"),
        prompts=[Prompt("p0", "a", (1, 5, 6)), Prompt("p1", "b", (1, 7))],
        output_dir=output_dir,
        backend_options=backend_options or {},
    )


# ----------------------------------------------------------------------------------- LLM(...) keywords


def test_no_speculation_has_no_speculative_config():
    kwargs = backend.llm_kwargs(make_spec(k=0))
    assert "speculative_config" not in kwargs
    assert kwargs["model"] == kwargs["tokenizer"] == "/m/target"
    assert kwargs["max_num_seqs"] == 16 and kwargs["max_model_len"] == 1024 and kwargs["seed"] == 7
    assert kwargs["dtype"] == "bfloat16"
    assert kwargs["disable_log_stats"] is False
    assert kwargs["skip_tokenizer_init"] is True
    assert kwargs["gpu_memory_utilization"] == backend.DEFAULT_GPU_MEMORY_UTILIZATION


def test_speculation_names_the_draft_model_and_k():
    kwargs = backend.llm_kwargs(make_spec(k=3))
    assert kwargs["speculative_config"] == {
        "method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 3, "enforce_eager": False,
    }


@pytest.mark.parametrize(("engine_graphs", "draft_graphs", "engine_eager", "draft_eager"), [
    ("full", "full", False, False),
    ("full", "none", False, True),
    ("none", "full", True, True),
    ("none", "none", True, True),
    ("full", None, False, False),  # the draft follows the engine by default
    ("none", None, True, True),
])
def test_cudagraph_modes_map_onto_enforce_eager(engine_graphs, draft_graphs, engine_eager, draft_eager):
    kwargs = backend.llm_kwargs(make_spec(k=2, engine_graphs=engine_graphs, draft_graphs=draft_graphs))
    assert kwargs["enforce_eager"] is engine_eager
    assert kwargs["speculative_config"]["enforce_eager"] is draft_eager


def test_materialised_dirs_and_backend_options_replace_the_defaults():
    spec = make_spec(k=1, backend_options={"gpu_memory_utilization": 0.8,
                                           "llm_kwargs": {"compilation_config": {"level": 0}}})
    kwargs = backend.llm_kwargs(spec, target_dir="/tmp/t", draft_dir="/tmp/d")
    assert kwargs["model"] == kwargs["tokenizer"] == "/tmp/t"
    assert kwargs["speculative_config"]["model"] == "/tmp/d"
    assert kwargs["gpu_memory_utilization"] == 0.8
    assert kwargs["compilation_config"] == {"level": 0}


def test_one_gpu_by_default_and_the_drafts_split_left_to_vllm():
    kwargs = backend.llm_kwargs(make_spec(k=2))
    assert kwargs["tensor_parallel_size"] == 1
    assert "draft_tensor_parallel_size" not in kwargs["speculative_config"]


@pytest.mark.parametrize(("tp", "draft_tp"), [(2, None), (4, 1), (2, 2)])
def test_tensor_parallel_sizes_reach_vllm_under_its_names(tp, draft_tp):
    spec = make_spec(k=3)
    spec.engine.options["tensor_parallel_size"] = tp
    spec.speculator.options["draft_tensor_parallel_size"] = draft_tp
    kwargs = backend.llm_kwargs(spec)
    assert kwargs["tensor_parallel_size"] == tp
    assert kwargs["speculative_config"].get("draft_tensor_parallel_size") == draft_tp
    no_draft = make_spec(k=0)
    no_draft.engine.options["tensor_parallel_size"] = tp
    assert backend.llm_kwargs(no_draft)["tensor_parallel_size"] == tp and "speculative_config" not in backend.llm_kwargs(no_draft)


@pytest.mark.parametrize(("tp", "draft_tp", "valid"), [(2, None, True), (2, 1, True), (2, 2, True), (4, 2, False),
                                                       (1, 2, False)])
def test_a_draft_split_is_what_vllm_takes_one_or_the_targets(tp, draft_tp, valid):
    from specexp.run_spec import _check_tensor_parallel

    spec = make_spec(k=2)
    spec.engine.options["tensor_parallel_size"] = tp
    spec.speculator.options["draft_tensor_parallel_size"] = draft_tp
    if valid:
        _check_tensor_parallel("vllm", spec.speculator, spec.engine)
        return
    with pytest.raises(ConfigError) as e:
        _check_tensor_parallel("vllm", spec.speculator, spec.engine)
    assert str(e.value) == (f"speculator.draft_tensor_parallel_size={draft_tp} is not valid with"
                            f" engine.tensor_parallel_size={tp}: vLLM takes 1 or {tp} (null = the target's, {tp})")


def test_max_model_len_is_capped_at_the_targets_positions():
    assert backend.llm_kwargs(make_spec(), max_positions=512)["max_model_len"] == 512
    assert backend.llm_kwargs(make_spec(), max_positions=4096)["max_model_len"] == 1024


def test_greedy_sampling_params_carry_no_seed_or_filters():
    kwargs = backend.sampling_params_kwargs(make_spec(temperature=0.0), eos_token_ids=[2])
    assert kwargs == {"max_tokens": 32, "ignore_eos": False, "detokenize": False, "temperature": 0.0,
                      "stop_token_ids": [2]}


def test_sampling_params_seed_each_request_and_turn_top_k_off_as_minus_one():
    spec = make_spec(temperature=0.8, top_k=0)
    first, second = (backend.sampling_params_kwargs(spec, i) for i in (0, 1))
    assert first["temperature"] == 0.8 and first["top_p"] == 0.9 and first["top_k"] == -1
    assert (first["seed"], second["seed"]) == (7, 8)
    assert backend.sampling_params_kwargs(make_spec(temperature=0.8, top_k=20))["top_k"] == 20


def test_ignore_eos_drops_the_stop_tokens():
    kwargs = backend.sampling_params_kwargs(make_spec(ignore_eos=True), eos_token_ids=[2, 7])
    assert kwargs["ignore_eos"] is True and "stop_token_ids" not in kwargs


def test_the_backend_config_group_sets_the_vllm_options():
    from omegaconf import OmegaConf

    from specexp.cli import compose_config

    cfg = OmegaConf.to_container(compose_config(["backend=vllm"]), resolve=True)
    assert cfg["backend"]["name"] == "vllm"
    assert cfg["backend"]["gpu_memory_utilization"] == backend.DEFAULT_GPU_MEMORY_UTILIZATION
    assert cfg["backend"]["multiprocessing"] is False


# ----------------------------------------------------------------------------------- metrics mapping


@dataclass
class Counter:  # shaped like vllm.v1.metrics.reader.Counter
    name: str
    value: int
    labels: dict = field(default_factory=dict)


@dataclass
class Vector:  # shaped like vllm.v1.metrics.reader.Vector
    name: str
    values: list
    labels: dict = field(default_factory=dict)


@dataclass
class Gauge:
    name: str
    value: float
    labels: dict = field(default_factory=dict)


def snapshot(num_drafts, num_draft_tokens, num_accepted, per_pos, labels=None):
    labels = labels or {"engine": "0"}
    return [
        Gauge("vllm:num_requests_running", 0.0, labels),
        Counter(backend.NUM_DRAFTS, num_drafts, labels),
        Counter(backend.NUM_DRAFT_TOKENS, num_draft_tokens, labels),
        Counter(backend.NUM_ACCEPTED_TOKENS, num_accepted, labels),
        Vector(backend.ACCEPTED_PER_POS, list(per_pos), labels),
    ]


def test_vllm_counters_give_the_design_metrics_and_their_identities():
    # 10 drafts of k=3: 8 accepted position 0, 5 positions 0..1, 2 all three -> 15 accepted tokens
    m = backend.acceptance_from_vllm_metrics(snapshot(10, 30, 15, [8, 5, 2]), k=3)
    assert m["num_drafts"] == 10 and m["num_draft_tokens"] == 30 and m["num_accepted_tokens"] == 15
    assert m["accepted_per_position"] == [8, 5, 2]
    assert m["drafted_per_position"] == [10, 10, 10]
    assert m["acceptance_length"] == pytest.approx(2.5)
    assert m["draft_acceptance_rate"] == pytest.approx(0.5)
    assert m["per_position_acceptance"] == pytest.approx([0.8, 0.5, 0.2])
    assert sum(m["per_position_acceptance"]) == pytest.approx(m["acceptance_length"] - 1)
    assert m["conditional_acceptance"] == pytest.approx([0.8, 5 / 8, 2 / 5])
    assert m["acceptance_histogram"] == [2, 3, 3, 2]
    assert sum(m["acceptance_histogram"]) == m["num_drafts"]
    assert sum(j * n for j, n in enumerate(m["acceptance_histogram"])) == m["num_accepted_tokens"]
    assert m["vllm_missing_draft_tokens"] == 0


def test_warmup_counts_are_subtracted():
    before = snapshot(2, 6, 3, [2, 1, 0])
    after = snapshot(12, 36, 18, [10, 6, 2])
    m = backend.acceptance_from_vllm_metrics(after, k=3, before=before)
    assert (m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"]) == (10, 30, 15)
    assert m["accepted_per_position"] == [8, 5, 2]


def test_counters_of_several_engines_are_summed():
    metrics = snapshot(4, 8, 3, [2, 1], {"engine": "0"}) + snapshot(6, 12, 5, [4, 1], {"engine": "1"})
    m = backend.acceptance_from_vllm_metrics(metrics, k=2)
    assert (m["num_drafts"], m["num_accepted_tokens"], m["accepted_per_position"]) == (10, 8, [6, 2])


def test_a_draft_identical_to_the_target_has_acceptance_length_k_plus_one():
    m = backend.acceptance_from_vllm_metrics(snapshot(5, 20, 20, [5, 5, 5, 5]), k=4)
    assert m["acceptance_length"] == 5.0 and m["acceptance_histogram"] == [0, 0, 0, 0, 5]


def test_shortened_drafts_are_counted_not_hidden():
    m = backend.acceptance_from_vllm_metrics(snapshot(10, 27, 12, [7, 4, 1]), k=3)
    assert m["vllm_missing_draft_tokens"] == 3
    assert m["draft_acceptance_rate"] == pytest.approx(12 / 27)


def test_no_speculation_and_no_counters_give_the_empty_metrics():
    m = backend.acceptance_from_vllm_metrics([Gauge("vllm:num_requests_running", 0.0)], k=0)
    assert m["num_drafts"] == 0 and m["acceptance_length"] == 1.0 and m["draft_acceptance_rate"] is None
    assert m["accepted_per_position"] == [] and m["acceptance_histogram"] == [0]


# ----------------------------------------------------------------------------------- latency mapping


@dataclass
class RequestStateStats:  # vLLM V1 (RequestOutput.metrics)
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0


@dataclass
class RequestMetrics:  # vLLM V0
    arrival_time: float
    last_token_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    time_in_queue: float | None
    finished_time: float | None = None


def test_v1_request_stats_give_ttft_tpot_e2e():
    stats = RequestStateStats(arrival_time=1.7e9, first_token_ts=100.0, last_token_ts=100.9,
                              first_token_latency=0.05, queued_ts=99.96, scheduled_ts=99.98)
    latency = backend.request_latency_from_vllm(stats, num_output_tokens=10)
    assert latency["ttft_ms"] == pytest.approx(50.0)
    assert latency["queue_ms"] == pytest.approx(20.0)
    assert latency["e2e_ms"] == pytest.approx(950.0)
    assert latency["tpot_ms"] == pytest.approx(100.0)


def test_v0_request_metrics_give_ttft_tpot_e2e():
    metrics = RequestMetrics(arrival_time=10.0, last_token_time=11.0, first_scheduled_time=10.01,
                             first_token_time=10.2, time_in_queue=0.01, finished_time=11.0)
    latency = backend.request_latency_from_vllm(metrics, num_output_tokens=5)
    assert latency["ttft_ms"] == pytest.approx(200.0)
    assert latency["queue_ms"] == pytest.approx(10.0)
    assert latency["e2e_ms"] == pytest.approx(1000.0)
    assert latency["tpot_ms"] == pytest.approx(200.0)


def test_missing_request_timings_are_none_never_zero():
    none = {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None, "queue_ms": None}
    assert backend.request_latency_from_vllm(None, 4) == none
    assert backend.request_latency_from_vllm(RequestStateStats(), 4) == none
    one_token = backend.request_latency_from_vllm(
        RequestStateStats(first_token_ts=5.0, last_token_ts=5.0, first_token_latency=0.02), 1)
    assert one_token["tpot_ms"] is None and one_token["ttft_ms"] == pytest.approx(20.0)


# ----------------------------------------------------------------------------------- graph log


def test_the_capture_log_line_gives_seconds_and_bytes():
    line = ("(EngineCore_DP0 pid=212) INFO 10-06 [gpu_model_runner.py:3480]"
            " Graph capturing finished in 1 secs, took 0.07 GiB")
    seconds, nbytes = backend.parse_graph_capture_log(f"INFO loading\n{line}\nINFO ready")
    assert seconds == 1.0 and nbytes == round(0.07 * (1 << 30))


def test_several_capture_lines_are_summed_and_a_line_without_memory_gives_none_bytes():
    text = "Graph capturing finished in 2 secs, took 0.25 GiB\nGraph capturing finished in 3 secs, took 0.50 GiB"
    assert backend.parse_graph_capture_log(text) == (5.0, round(0.75 * (1 << 30)))
    assert backend.parse_graph_capture_log("Graph capturing finished in 4 secs.") == (4.0, None)


def test_an_eager_run_logs_no_capture():
    assert backend.parse_graph_capture_log("INFO Model loading took 0.1 GiB") is None
    assert backend.parse_graph_capture_log("") is None


def test_the_log_capture_sees_records_of_vllm_child_loggers():
    capture = backend.LogCapture()
    child = logging.getLogger("vllm.v1.worker.gpu_model_runner")  # unconfigured: WARNING from root
    with capture.attached():
        child.info("Graph capturing finished in %.0f secs, took %.2f GiB", 1.2, 0.07)
    child.info("after detaching: not captured")
    assert backend.parse_graph_capture_log(capture.text) == (1.0, round(0.07 * (1 << 30)))
    assert len(capture.lines) == 1


# ----------------------------------------------------------------------------------- availability


def test_run_without_vllm_is_a_one_line_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ConfigError) as info:
        get_backend("vllm").run(make_spec(k=2))
    message = str(info.value)
    assert "\n" not in message
    assert "'vllm' package" in message and "pip install -e '.[vllm]'" in message


def test_run_without_a_gpu_is_a_one_line_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", type(sys)("vllm"))  # an importable stand-in
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs a CUDA GPU") as info:
        backend.run(make_spec(k=2))
    assert "\n" not in str(info.value)


def test_the_flashinfer_sampler_is_off_before_vllm_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigError):
        backend.run(make_spec())
    assert os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


# ----------------------------------------------------------------------------------- random weights


@pytest.mark.parametrize("source", ["configs/tiny-random-llama-draft", "configs/tiny-random-lfm2-draft"])
def test_random_weights_become_a_checkpoint_transformers_loads_identically(tmp_path, source):
    from transformers import AutoModelForCausalLM

    from specexp.models import load_model, resolve_model_dir

    model_dir = str(resolve_model_dir(source))
    spec = make_spec(k=1, weights="random", target=model_dir, draft=model_dir)
    spec.pair.dtype = "float32"
    out = backend.materialize_random_weights(spec.pair.target, spec, tmp_path / "target")
    assert json.loads((tmp_path / "target" / "config.json").read_text()) == json.loads(
        (resolve_model_dir(source) / "config.json").read_text())
    assert (tmp_path / "target" / "tokenizer.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    native = load_model(model_dir, dtype="float32", weights="random", seed=spec.pair.init_seed).state_dict()
    assert loaded.keys() == native.keys()
    for name, tensor in native.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0, msg=name)


# ----------------------------------------------------------------------------------- zoo LFM2 configs


def _zoo_lfm2_configs() -> list[str]:
    """Zoo names (``tiny-lfm2``, ``configs/lfm2-350m``, ...) of every LFM2 config.json the package ships."""
    from specexp.zoo import ZOO_DIR

    return sorted(p.parent.name if p.parent.parent == ZOO_DIR else f"configs/{p.parent.name}"
                  for p in ZOO_DIR.rglob("config.json") if json.loads(p.read_text()).get("model_type") == "lfm2")


def test_every_lfm2_zoo_config_carries_the_fields_vllm_reads():
    from transformers import AutoConfig

    from specexp.models import load_config, resolve_model_dir

    names = _zoo_lfm2_configs()
    assert {"tiny-lfm2", "tiny-lfm2-draft", "configs/tiny-random-lfm2", "configs/lfm2-350m"} <= set(names)
    for name in names:
        model_dir = resolve_model_dir(name)
        config = json.loads((model_dir / "config.json").read_text())
        assert config["conv_dim"] == config["block_dim"] == config["hidden_size"], name
        hf = AutoConfig.from_pretrained(model_dir)
        assert hf.conv_dim == hf.block_dim == hf.hidden_size, name
        assert load_config(model_dir).hidden_size == config["hidden_size"], name


# ----------------------------------------------------------------------------------- run, on a stand-in


class FakeLLM:
    """Stands in for ``vllm.LLM``: logs a capture line, emits the prompt's ids reversed, and counts k-token
    drafts with 1 accepted token per draft (the warm-up counts too, and must be subtracted)."""

    instances: ClassVar[list] = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.counts = kwargs, [], [0, 0, 0, []]
        self.k = (kwargs.get("speculative_config") or {}).get("num_speculative_tokens", 0)
        logging.getLogger("vllm.v1.worker.gpu_model_runner").info(
            "Graph capturing finished in %.0f secs, took %.2f GiB", 2.0, 0.5)
        FakeLLM.instances.append(self)

    def generate(self, prompts, params, use_tqdm=True):
        params = params if isinstance(params, list) else [params] * len(prompts)
        self.calls.append((prompts, params))
        outputs = []
        for prompt, p in zip(prompts, params):
            ids = list(reversed(prompt["prompt_token_ids"]))[: p.kwargs["max_tokens"]]
            drafts = len(ids) // 2 if self.k else 0
            self.counts[0] += drafts
            self.counts[1] += drafts * self.k
            self.counts[2] += drafts
            per_pos = [drafts] + [0] * (self.k - 1) if self.k else []
            self.counts[3] = [a + b for a, b in zip(self.counts[3] or [0] * self.k, per_pos)]
            stats = RequestStateStats(first_token_ts=10.0, last_token_ts=10.0 + 0.01 * (len(ids) - 1),
                                      first_token_latency=0.02)
            outputs.append(type("Out", (), {"outputs": [type("C", (), {"token_ids": ids})()], "metrics": stats})())
        return outputs

    def get_metrics(self):
        return snapshot(*self.counts[:3], list(self.counts[3]))


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.fixture
def fake_vllm(monkeypatch):
    module = type(sys)("vllm")
    module.LLM, module.SamplingParams, module.__version__ = FakeLLM, FakeSamplingParams, "0.0-fake"
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    FakeLLM.instances = []
    return module


def test_run_maps_a_vllm_run_onto_outputs_and_metrics(fake_vllm, tiny_llama_dir, tmp_path):
    spec = make_spec(k=3, target=str(tiny_llama_dir), draft=str(tiny_llama_dir), output_dir=str(tmp_path))
    spec.pair.target.tokenizer_path = str(tiny_llama_dir / "tokenizer.json")
    spec.prompts = [Prompt("p0", "a", (1, 5, 6, 7, 8, 9)), Prompt("p1", "b", (1, 7, 9, 11))]
    result = backend.run(spec)
    llm = FakeLLM.instances[0]
    assert llm.kwargs["speculative_config"]["num_speculative_tokens"] == 3
    warmup, measured = llm.calls
    assert warmup[1][0].kwargs["max_tokens"] == min(backend.WARMUP_NEW_TOKENS, spec.sampling.max_new_tokens)
    assert [p["prompt_token_ids"] for p in measured[0]] == [[1, 5, 6, 7, 8, 9], [1, 7, 9, 11]]
    assert [r.output_token_ids for r in result.requests] == [[9, 8, 7, 6, 5, 1], [11, 9, 7, 1]]
    assert result.requests[0].output_text  # decoded with the target's tokenizer.json
    m = result.metrics
    assert m["num_drafts"] == 5 and m["num_draft_tokens"] == 15 and m["num_accepted_tokens"] == 5  # warm-up excluded
    assert m["acceptance_length"] == pytest.approx(2.0) and m["accepted_per_position"] == [5, 0, 0]
    assert m["graph_capture_s"] == 2.0 and m["graph_capture_bytes"] == round(0.5 * (1 << 30))
    assert m["graph_capture_per_size"] is None
    assert result.requests[0].ttft_ms == pytest.approx(20.0) and result.requests[0].tpot_ms == pytest.approx(10.0)
    assert m["num_output_tokens"] == 10 and m["output_tokens_per_s"] > 0
    assert result.steps == [] and result.env["gpu"] == "Fake GPU" and result.env["vllm"] == "0.0-fake"
    assert "Graph capturing finished" in (tmp_path / "vllm.log").read_text()


def test_run_on_a_random_pair_hands_vllm_a_materialised_checkpoint(fake_vllm, tmp_path, monkeypatch):
    from specexp.models import resolve_model_dir

    seen = {}
    real = backend.materialize_random_weights

    def on_cpu(model, spec, dest, device="cpu"):
        seen[dest.name] = real(model, spec, dest, "cpu")
        assert (dest / "model.safetensors").is_file()
        return seen[dest.name]

    monkeypatch.setattr(backend, "materialize_random_weights", on_cpu)
    model_dir = str(resolve_model_dir("configs/tiny-random-lfm2-draft"))
    spec = make_spec(k=2, weights="random", target=model_dir, draft=model_dir, output_dir=str(tmp_path))
    spec.pair.dtype = "float32"
    backend.run(spec)
    kwargs = FakeLLM.instances[0].kwargs
    assert kwargs["model"] == seen["target"] and kwargs["speculative_config"]["model"] == seen["draft"]
    assert not os.path.exists(seen["target"])  # the temporary checkpoint is gone after the run
