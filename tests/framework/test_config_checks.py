"""Every key and value of a run's config is checked before anything is created or loaded, with one line
that names the key or value and what would be valid, the same for every backend.

Most cases call :func:`specexp.launch.plan_run` (what ``python -m specexp run`` does before it creates a
directory); a few go through the CLI in a subprocess to check the exit status and that no directory appears.
"""

from __future__ import annotations

import shutil

import pytest
from cli_runs import TINY_RUN, error_line, run_cli, run_dirs

from specexp import launch
from specexp.errors import ConfigError


def refused(args: list[str], *fragments: str) -> str:
    with pytest.raises(ConfigError) as info:
        launch.plan_run(["run", *TINY_RUN, *args])
    message = str(info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ----------------------------------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(("override", "fragments"), [
    ("+speculator.num_speculatve_tokens=2",
     ["unknown key speculator.num_speculatve_tokens", "did you mean speculator.num_speculative_tokens"]),
    ("speculator.num_speculatve_tokens=2",
     ["unknown key speculator.num_speculatve_tokens", "did you mean speculator.num_speculative_tokens"]),
    ("++speculator.num_speculatve_tokens=2", ["unknown key speculator.num_speculatve_tokens"]),
    ("+sampling.temprature=0.5", ["unknown key sampling.temprature", "sampling.temperature"]),
    ("engine.max_num_seq=4", ["unknown key engine.max_num_seq", "engine.max_num_seqs"]),
    ("workload.num_prompt=2", ["unknown key workload.num_prompt", "workload.num_prompts"]),
    ("+pair.target.pth=x", ["unknown key pair.target.pth", "pair.target.path"]),
    ("tracking.wandb.mod=offline", ["unknown key tracking.wandb.mod", "tracking.wandb.mode"]),
    ("+short_conv.use_full_cuda_grap=true", ["unknown key short_conv.use_full_cuda_grap", "use_full_cuda_graph"]),
    ("samplng.temperature=0.5", ["unknown config group or key 'samplng'", "did you mean sampling"]),
    ("+samplng.temperature=0.5", ["unknown config group or key 'samplng'", "did you mean sampling"]),
    ("samplng=greedy", ["unknown config group or key 'samplng'", "did you mean sampling"]),
    ("+nmae=x", ["unknown config group or key 'nmae'", "did you mean name"]),
    ("backend.gpu_memory_utilization=0.3", ["unknown key backend.gpu_memory_utilization", "backend 'native'",
                                            "backend=vllm"]),
])
def test_unknown_keys_are_refused_with_the_closest_valid_names(override, fragments):
    message = refused([override], *fragments)
    assert "extra." in message or "group" in message, "the line says where free-form values go"


def test_every_group_refuses_an_appended_key(tmp_path):
    from specexp.cli import conf_dir

    groups = [p.name for p in conf_dir().iterdir() if p.is_dir() and p.name not in ("exp", "zoo", "hydra")]
    assert {"pair", "speculator", "short_conv", "engine", "sampling", "workload", "backend", "tracking"} <= set(groups)
    for group in groups:
        refused([f"+{group}.surely_not_a_key=1"], f"unknown key {group}.surely_not_a_key")


@pytest.mark.parametrize("override", [
    "+engine.max_num_batched_tokens=64",
    "engine.num_kv_blocks=64",                     # a known key the yaml leaves out: no '+' needed
    "+speculator.rejection=synthetic",
    "speculator.synthetic_acceptance_rate=0.5",
    "+extra.note=hello",                           # the free-form place
    "+extra.sweep.label=a",
    "+sampling.temperature=0.5",                   # '+' on a key that exists just sets it
])
def test_known_and_free_form_keys_are_accepted(override):
    plan = launch.plan_run(["run", *TINY_RUN, override])
    key, value = override.lstrip("+").split("=")
    node = plan.jobs[0].config
    for part in key.split("."):
        node = node[part]
    assert str(node) == value


def test_a_typo_inside_an_experiment_file_is_refused(tmp_path, monkeypatch):
    from specexp.cli import conf_dir

    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "exp" / "typo.yaml").write_text(
        "# @package _global_\n# an experiment with a typo\nname: typo\nsampling:\n  max_new_tokns: 3\n")
    monkeypatch.setenv("SPECEXP_CONF_DIR", str(conf))
    refused(["+exp=typo"], "unknown key sampling.max_new_tokns", "sampling.max_new_tokens")


def test_cli_refuses_an_appended_typo_in_one_line_and_creates_nothing(tmp_path):
    runs = tmp_path / "runs"
    proc = run_cli(["run", *TINY_RUN, "+speculator.num_speculatve_tokens=2"], runs)
    assert proc.returncode == 2
    line = error_line(proc)
    assert "speculator.num_speculatve_tokens" in line and "speculator.num_speculative_tokens" in line
    assert run_dirs(runs) == [], "a config error creates no run directory"


def test_cli_refuses_a_typo_in_a_group_name_in_one_line(tmp_path):
    proc = run_cli(["run", *TINY_RUN, "samplng.temperature=0.5"], tmp_path / "runs")
    assert proc.returncode == 2
    assert "did you mean sampling" in error_line(proc)


# ----------------------------------------------------------------------------------------------- values


@pytest.mark.parametrize(("override", "fragments"), [
    ("sampling.temperature=abc", ["sampling.temperature='abc'", "a number"]),
    ("sampling.temperature=-1", ["sampling.temperature=-1", ">= 0"]),
    ("sampling.max_new_tokens=2.5", ["sampling.max_new_tokens=2.5", "an integer"]),
    ("sampling.ignore_eos=maybe", ["sampling.ignore_eos='maybe'", "true or false"]),
    ("speculator.num_speculative_tokens=true", ["speculator.num_speculative_tokens=True", "an integer"]),
    ("engine.max_num_seqs=two", ["engine.max_num_seqs='two'", "an integer >= 1"]),
    ("engine.max_num_seqs=0", ["engine.max_num_seqs=0", ">= 1"]),
    ("engine.block_size=0", ["engine.block_size=0", ">= 1"]),
    ("engine.cudagraph_capture_sizes=[1,x]", ["engine.cudagraph_capture_sizes", "integers >= 1"]),
    ("engine.linear_kernel=fast", ["engine.linear_kernel='fast'", "cublas"]),
    ("engine.linear_kernel=triton_gemv", ["engine.linear_kernel='triton_gemv'", "engine.device=cuda"]),
    ("speculator.num_speculative_tokens=5000", ["speculator.num_speculative_tokens=5000", "engine.max_model_len"]),
    ("+speculator.synthetic_acceptance_rate=2", ["speculator.synthetic_acceptance_rate=2", "[0, 1]"]),
    ("+speculator.rejection=fancy", ["speculator.rejection='fancy'", "standard", "synthetic"]),
    ("workload.num_prompts=-1", ["workload.num_prompts=-1", "all"]),
    ("workload.num_prompts=0", ["workload.num_prompts=0", "all"]),
    ("workload.input_len=0", ["workload.input_len=0", ">= 1"]),
    ("tracking.wandb.mode=loud", ["tracking.wandb.mode='loud'", "offline"]),
    ("tracking.wandb.tags=notalist", ["tracking.wandb.tags", "a list"]),
    ("pair.dtype=fp8", ["pair.dtype='fp8'", "bfloat16"]),
    ("pair.weights=pretty", ["pair.weights='pretty'", "auto", "trained", "random"]),
    ("name=a/b", ["name='a/b'", "directory"]),
])
def test_bad_values_are_named_with_what_is_valid(override, fragments):
    refused([override], *fragments)


def test_num_prompts_all_means_every_prompt():
    plan = launch.plan_run(["run", *TINY_RUN, "workload=code", "pair=tiny_lfm2", "workload.num_prompts=all"])
    assert plan.jobs[0].config["workload"]["num_prompts"] == "all"
    assert len(plan.jobs[0].spec.prompts) > 32


@pytest.mark.parametrize("override", ["sampling.top_p=1.5", "sampling.top_k=-1", "sampling.top_p=0"])
def test_every_backend_refuses_a_bad_sampling_value_with_the_same_line(override):
    messages = {backend: refused(["sampling=sample", override, f"backend={backend}"])
                for backend in ("native", "hf", "vllm")}
    assert len(set(messages.values())) == 1, messages
    assert override.split("=")[0] in messages["hf"]


def test_synthetic_rejection_is_refused_where_the_backend_has_none():
    refused(["+speculator.rejection=synthetic", "backend=hf"], "speculator.rejection='synthetic'", "native")


def test_checks_load_no_model(monkeypatch):
    from specexp.models import loader

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded while checking the config")

    monkeypatch.setattr(loader, "load_model", no_loading)
    monkeypatch.setattr(loader, "load_weights_", no_loading)
    launch.plan_run(["run", *TINY_RUN, "backend=hf"])
    refused(["sampling=sample", "sampling.top_p=1.5", "backend=hf"], "sampling.top_p=1.5")


def test_cli_refuses_top_p_above_one_on_hf_before_loading_anything(tmp_path):
    runs = tmp_path / "runs"
    proc = run_cli(["run", *TINY_RUN, "backend=hf", "sampling=sample", "sampling.top_p=1.5"], runs)
    assert proc.returncode == 2
    assert "sampling.top_p=1.5" in error_line(proc)
    assert run_dirs(runs) == []


def test_cli_refuses_a_non_numeric_value_in_one_line(tmp_path):
    proc = run_cli(["run", *TINY_RUN, "sampling.temperature=abc"], tmp_path / "runs")
    assert proc.returncode == 2
    assert "sampling.temperature='abc'" in error_line(proc)


def test_a_sweep_with_one_bad_job_is_refused_before_any_job_runs(tmp_path):
    runs = tmp_path / "runs"
    proc = run_cli(["run", "-m", *TINY_RUN, "speculator.num_speculative_tokens=0,-1,2"], runs)
    assert proc.returncode == 2
    line = error_line(proc)
    assert "job 1" in line and "speculator.num_speculative_tokens=-1" in line
    assert run_dirs(runs) == []


def test_a_bad_progress_setting_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXP_PROGRESS", "loud")
    with pytest.raises(ConfigError, match="SPECEXP_PROGRESS='loud' is not valid"):
        launch.plan_run(["run", *TINY_RUN])
