"""Every bad input of a run gives a one-line error naming the value and what is valid, before any model
is loaded (build_run_spec loads none); a few go through the CLI in a subprocess to check the exit status."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from specexp.cli import compose_config
from specexp.errors import ConfigError
from specexp.experiment import RunContext, build_run_spec


@pytest.fixture
def pair_overrides(tiny_llama_dir, tiny_llama_draft_dir):
    return ["pair=local", f"pair.target.path={tiny_llama_dir}", f"pair.draft.path={tiny_llama_draft_dir}",
            "workload.num_prompts=2", "workload.input_len=8", "workload.output_len=4"]


def build(overrides, tmp_path):
    cfg = OmegaConf.to_container(compose_config(overrides), resolve=True)
    return build_run_spec(cfg, RunContext(run_dir=tmp_path, experiment="test"))


def expect_error(overrides, tmp_path, *fragments):
    with pytest.raises(ConfigError) as info:
        build(overrides, tmp_path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_a_good_config_builds_a_spec(pair_overrides, tmp_path):
    spec = build(pair_overrides, tmp_path)
    assert spec.pair.target.architecture == "LlamaForCausalLM" and len(spec.prompts) == 2
    assert spec.sampling.max_new_tokens == 4 and spec.sampling.ignore_eos


@pytest.mark.parametrize("override,fragments", [
    ("+exp=nope", ["unknown experiment 'nope'", "quickstart", "depth_sweep"]),
    ("pair=nope", ["unknown pair 'nope'", "tiny_random"]),
    ("backend=nope", ["unknown backend 'nope'", "hf", "native", "vllm"]),
    ("workload=nope", ["unknown workload 'nope'", "jsonl", "random"]),
])
def test_unknown_choices_list_the_valid_ones(override, fragments):
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    assert all(f in str(info.value) for f in fragments), str(info.value)


def test_negative_depth(pair_overrides, tmp_path):
    expect_error(pair_overrides + ["speculator.num_speculative_tokens=-1"], tmp_path,
                 "speculator.num_speculative_tokens=-1", ">= 0")


def test_missing_checkpoint_directory(pair_overrides, tmp_path):
    expect_error(pair_overrides + [f"pair.draft.path={tmp_path}/nowhere"], tmp_path, "nowhere", "not found", "zoo")


def test_missing_weight_files(pair_overrides, tiny_llama_draft_dir, tmp_path):
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(tiny_llama_draft_dir / "config.json", config_only)
    expect_error(pair_overrides + [f"pair.draft.path={config_only}", "pair.weights=trained"], tmp_path,
                 "draft checkpoint", "no weight files", "pair.weights=random")


def test_missing_config_json(pair_overrides, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    expect_error(pair_overrides + [f"pair.draft.path={empty}"], tmp_path, "no config.json")


def test_unsupported_architecture(pair_overrides, tiny_llama_draft_dir, tmp_path):
    other = tmp_path / "gpt2"
    shutil.copytree(tiny_llama_draft_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    expect_error(pair_overrides + [f"pair.draft.path={other}"], tmp_path,
                 "draft checkpoint", "architectures ['GPT2LMHeadModel'] not supported", "LlamaForCausalLM",
                 "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Lfm2ForCausalLM")


def test_draft_vocab_differs(pair_overrides, make_tiny_checkpoint, tmp_path):
    wide = make_tiny_checkpoint("wide-vocab", "llama", vocab_size=400)
    expect_error(pair_overrides + [f"pair.draft.path={wide}"], tmp_path,
                 "draft vocab (400) != target vocab (384)", "share the target's tokenizer")


def test_draft_tokenizer_differs(pair_overrides, tiny_llama_draft_dir, tmp_path):
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_llama_draft_dir, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    expect_error(pair_overrides + [f"pair.draft.path={other}"], tmp_path, "draft tokenizer", "differs")


def test_cuda_without_a_gpu(pair_overrides, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    expect_error(pair_overrides + ["engine=cuda"], tmp_path, "engine.device=cuda", "no CUDA GPU", "engine=cpu")


def test_draft_prefill_region_last_two_is_refused_for_a_conv_draft_only(pair_overrides, tiny_lfm2_draft_dir,
                                                                       tmp_path):
    assert build(pair_overrides + ["engine.draft_prefill_region=last_two"], tmp_path)  # an attention draft
    hybrid = [o for o in pair_overrides if not o.startswith("pair.draft")] + [f"pair.draft.path={tiny_lfm2_draft_dir}"]
    expect_error(hybrid + ["engine.draft_prefill_region=last_two"], tmp_path, "engine.draft_prefill_region=last_two",
                 "short-conv layers", "'auto' or 'full'")
    assert build(hybrid + ["engine.draft_prefill_region=auto"], tmp_path)
    assert build(hybrid + ["engine.draft_prefill_region=last_two", "speculator.num_speculative_tokens=0"], tmp_path)


def test_bad_enum_values_name_the_choices(pair_overrides, tmp_path):
    expect_error(pair_overrides + ["pair.weights=pretty"], tmp_path, "pair.weights='pretty'", "trained, random")
    expect_error(pair_overrides + ["engine.device=tpu"], tmp_path, "engine.device='tpu'", "cpu, cuda")


@pytest.mark.parametrize("backend", ["native", "hf"])
def test_tensor_parallelism_is_refused_where_a_model_runs_on_one_device(pair_overrides, tmp_path, backend):
    expect_error(pair_overrides + [f"backend={backend}", "engine.tensor_parallel_size=2"], tmp_path,
                 f"engine.tensor_parallel_size=2: backend {backend} runs the target on one device", "backend=vllm")
    expect_error(pair_overrides + [f"backend={backend}", "speculator.draft_tensor_parallel_size=2"], tmp_path,
                 "speculator.draft_tensor_parallel_size=2", "backend=vllm")
    assert build(pair_overrides + [f"backend={backend}", "engine.tensor_parallel_size=1"], tmp_path)
    expect_error(pair_overrides + ["engine.tensor_parallel_size=0"], tmp_path, "engine.tensor_parallel_size=0 is not"
                 " valid", ">= 1")


def test_empty_workload(pair_overrides, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    expect_error(pair_overrides + ["workload=jsonl", f"workload.path={empty}"], tmp_path, "has no prompts")


def test_prompt_longer_than_max_model_len(pair_overrides, tmp_path):
    expect_error(pair_overrides + ["workload.input_len=30", "engine.max_model_len=32"], tmp_path,
                 "prompt 'random-0' has 30 tokens + 4 new tokens > engine.max_model_len=32")


def run_cli(args, tmp_path):
    env = {**os.environ, "SPECEXP_RUNS_DIR": str(tmp_path / "runs")}
    return subprocess.run([sys.executable, "-m", "specexp", *args], capture_output=True, text=True, env=env, check=False,
                          timeout=300)


@pytest.mark.parametrize("args,fragment", [
    (["run", "+exp=nope"], "unknown experiment 'nope': choose one of"),
    (["run", "+exp=quickstart", "pair=nope"], "unknown pair 'nope': choose one of"),
    (["run", "+exp=quickstart", "backend=nope"], "unknown backend 'nope': choose one of"),
    (["run", "+exp=quickstart", "workload=nope"], "unknown workload 'nope': choose one of"),
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["run", "pair=local", "tracking=disabled"], "no value for pair.draft.path, pair.target.path"),
    (["run", "+exp=quickstart", "engine.tensor_parallel_size=2"],
     "engine.tensor_parallel_size=2: backend native runs the target on one device"),
    (["run", "-m", "+exp=quickstart", "speculator.num_speculative_tokens=1,2", "sweep.devices=0,x"],
     "sweep.devices=0,x is not valid: 'x' is not a GPU index"),
    (["run", "+exp=quickstart", "sweep.gpus_per_job=0"], "sweep.gpus_per_job=0 is not valid"),
    (["run", "+exp=quickstart", "pair=tiny_lfm2_hybrid", "engine.draft_prefill_region=last_two"],
     "engine.draft_prefill_region=last_two rebuilds the draft's KV only: this draft has short-conv layers"),
])
def test_cli_rejects_unknown_names_with_one_line_and_status_2(args, fragment, tmp_path):
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specexp: error: ") and fragment in lines[0], proc.stderr


def test_cli_refuses_gpus_for_a_sweep_on_a_machine_without_any(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_cli(["run", "-m", "+exp=quickstart", "speculator.num_speculative_tokens=1,2", "sweep.devices=0,1",
                    f"hydra.sweep.dir={tmp_path}/sweep"], tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specexp: error: sweep.devices=0,1 names GPUs"), proc.stderr
    assert not (tmp_path / "sweep").exists()


def test_cli_run_with_a_bad_value_is_refused_before_a_directory_exists(pair_overrides, tmp_path):
    proc = run_cli(["run", *pair_overrides, "speculator.num_speculative_tokens=-2", "tracking=disabled",
                    f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specexp: error: speculator.num_speculative_tokens=-2"), proc.stderr
    assert not (tmp_path / "run").exists(), "a config error found before the run starts creates no directory"


# ------------------------------------------------------------------ prompt files, positions, checkpoints


def test_a_prompt_file_that_is_not_utf8_is_named_with_its_line(pair_overrides, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    expect_error(pair_overrides + ["workload=jsonl", f"workload.path={path}"], tmp_path,
                 f"workload.path file {path} is not UTF-8: line 2, byte 16 is 0xe9", "save it as UTF-8")


def test_cli_names_a_non_utf8_prompt_file_in_one_line(pair_overrides, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "\xff"}\n')
    proc = run_cli(["run", *pair_overrides, "workload=jsonl", f"workload.path={path}", "tracking=disabled"], tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path} is not UTF-8: line 1" in lines[0], proc.stderr


@pytest.fixture
def short_context_target(tiny_llama_dir, tmp_path):
    """The tiny target, told it was trained for 16 positions only."""
    target = tmp_path / "short-context"
    shutil.copytree(tiny_llama_dir, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16}))
    return target


def test_requests_past_max_position_embeddings_are_refused_naming_both_numbers(pair_overrides, short_context_target,
                                                                               tmp_path):
    overrides = pair_overrides + [f"pair.target.path={short_context_target}", "workload.input_len=12",
                                  "workload.output_len=8"]
    expect_error(overrides, tmp_path, "reach 20 positions", "target's max_position_embeddings=16",
                 "engine.allow_long_max_model_len=true")
    spec = build(overrides + ["engine.allow_long_max_model_len=true", "engine.max_model_len=2048"], tmp_path)
    (warning,) = spec.warnings
    assert "engine.max_model_len=2048 > the target's max_position_embeddings=16" in warning


def test_a_max_model_len_above_max_position_embeddings_is_a_warning_naming_both(pair_overrides, short_context_target,
                                                                               tmp_path):
    spec = build(pair_overrides + [f"pair.target.path={short_context_target}", "workload.input_len=6",
                                   "workload.output_len=4", "engine.max_model_len=2048"], tmp_path)
    assert spec.warnings == [("engine.max_model_len=2048 > the target's max_position_embeddings=16; this run's"
                             " requests reach 10 positions")]


def test_too_few_kv_blocks_are_refused_before_loading(pair_overrides, tmp_path):
    expect_error(pair_overrides + ["engine.num_kv_blocks=1", "engine.block_size=4"], tmp_path,
                 "needs", "KV blocks", "engine.num_kv_blocks=1")


def test_a_missing_local_checkpoint_creates_no_directory(tmp_path):
    runs = tmp_path / "runs"
    proc = run_cli(["run", "pair=local", f"pair.target.path={tmp_path}/nowhere", f"pair.draft.path={tmp_path}/nowhere",
                    "tracking=disabled"], runs)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "target checkpoint" in lines[0] and "not found" in lines[0], proc.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_a_failure_after_the_run_started_keeps_its_record(pair_overrides, tiny_llama_draft_dir, tmp_path):
    broken = tmp_path / "mismatched-draft"
    shutil.copytree(tiny_llama_draft_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] + 8}))
    run_dir = tmp_path / "run"
    proc = run_cli(["run", *pair_overrides, f"pair.draft.path={broken}", "speculator.num_speculative_tokens=2",
                    "tracking=disabled", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"specexp: error: ValueError: {broken / 'model.safetensors'}: ") and "shape" in line, line
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and "its config.json implies" in record["error"]
    assert "Traceback" in (run_dir / "error.log").read_text()
