"""Every experiment composes; the CLI lists and explains itself."""

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from specexp.cli import choices, compose_config, conf_dir, main

EXPERIMENTS = ["quickstart", "depth_sweep", "backend_compare"]


def test_the_config_directory_is_absolute_and_complete():
    root = conf_dir()
    assert root.is_absolute() and (root / "config.yaml").is_file()
    for group in ("pair", "speculator", "short_conv", "engine", "sampling", "workload", "backend", "tracking", "exp"):
        assert choices(group), f"config group {group}/ is empty"
    assert set(EXPERIMENTS) <= set(choices("exp"))


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_composes_with_the_contract_keys(exp):
    cfg = OmegaConf.to_container(compose_config([f"+exp={exp}"]), resolve=True)
    assert cfg["name"] == exp
    for key in ("pair.target.path", "pair.draft.path", "pair.weights", "pair.dtype",
                "speculator.num_speculative_tokens", "speculator.cudagraph_mode", "short_conv.use_full_cuda_graph",
                "engine.device", "engine.max_num_seqs", "engine.max_model_len", "engine.block_size",
                "engine.cudagraph_mode", "engine.seed", "sampling.temperature", "sampling.max_new_tokens",
                "sampling.ignore_eos", "workload.name", "workload.num_prompts", "backend.name",
                "tracking.wandb.mode", "tracking.wandb.project"):
        node = cfg
        for part in key.split("."):
            assert part in node, f"{exp}: missing {key}"
            node = node[part]
    assert cfg["tracking"]["wandb"]["mode"] == "offline"


def test_depth_sweep_declares_depths_0_to_8():
    cfg = compose_config(["+exp=depth_sweep"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params["speculator.num_speculative_tokens"] == "range(0,9)"


def test_backend_compare_sweeps_native_hf_and_vllm_on_one_pair():
    cfg = compose_config(["+exp=backend_compare"], return_hydra_config=True)
    assert set(cfg.hydra.sweeper.params["backend"].split(",")) == {"native", "hf", "vllm"}
    assert cfg.pair.name == "tiny_llama" and cfg.sampling.temperature == 0.0


def test_overrides_reach_the_config():
    cfg = compose_config(["+exp=quickstart", "backend=native", "speculator.num_speculative_tokens=2", "sampling=sample"])
    assert (cfg.backend.name, cfg.speculator.num_speculative_tokens, cfg.sampling.temperature) == ("native", 2, 1.0)


def test_list_prints_one_line_per_pair_experiment_workload_backend(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ["tiny_random", "tiny_random_self", "quickstart", "depth_sweep", "random", "jsonl", "hf", "native", "vllm"]:
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name


def test_help_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "specexp", "--help"], capture_output=True, text=True, check=True).stdout
    assert "run [+exp=NAME]" in out and "list" in out and "train +zoo=NAME" in out


@pytest.mark.parametrize(("overrides", "draft_mode"), [
    (["engine=cuda"], "full"),  # the draft follows the engine by default
    (["engine=cpu"], "none"),
    (["engine=cuda", "speculator.cudagraph_mode=none"], "none"),  # an explicit draft mode wins...
    (["engine=cuda", "engine.cudagraph_mode=none", "speculator.cudagraph_mode=full"], "none"),  # ...not over eager
])
def test_the_native_drafts_graph_mode_follows_the_engine(overrides, draft_mode):
    cfg = OmegaConf.to_container(compose_config(["+exp=quickstart", *overrides]), resolve=True)
    assert cfg["speculator"]["cudagraph_mode"] in ("none", "full")  # records keep docs/design.md §6's values
    _, speculator, _ = _native_configs(overrides)
    assert speculator.cudagraph_mode == draft_mode


def _native_configs(overrides):
    """The native engine's (EngineConfig, SpeculatorConfig, SamplingConfig) for the quickstart + overrides."""
    from types import SimpleNamespace

    from specexp.backends.native import engine_configs
    from specexp.specs import EngineSpec, SamplingSpec, SpeculatorSpec, group_spec

    cfg = OmegaConf.to_container(compose_config(["+exp=quickstart", *overrides]), resolve=True)
    spec = SimpleNamespace(
        engine=group_spec(EngineSpec, cfg["engine"]), speculator=group_spec(SpeculatorSpec, cfg["speculator"]),
        sampling=group_spec(SamplingSpec, cfg["sampling"]), pair=SimpleNamespace(dtype=cfg["pair"]["dtype"]),
    )
    return engine_configs(spec)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["engine=cuda"], {"linear_kernel": "triton_skinny", "fold_norm_weights": True, "plain_decode_lookahead": True,
                       "cudagraph_prefill_tokens": (16, 32, 64, 128), "cudagraph_shared_pool": True,
                       "compile_pointwise": True, "cudagraph_mixed": "joined"}),
    (["engine=cpu"], {"linear_kernel": "cublas", "fold_norm_weights": False, "cudagraph_prefill_tokens": (),
                      "compile_pointwise": False}),
    (["engine=cuda", "engine.fold_norm_weights=false", "engine.plain_decode_lookahead=false",
      "engine.cudagraph_prefill_tokens=[]", "engine.cudagraph_shared_pool=false", "engine.compile_pointwise=false",
      "engine.cudagraph_mixed=parts"],
     {"fold_norm_weights": False, "plain_decode_lookahead": False, "cudagraph_prefill_tokens": (),
      "cudagraph_shared_pool": False, "compile_pointwise": False, "cudagraph_mixed": "parts"}),
])
def test_engine_group_keys_reach_the_native_engine(overrides, expected):
    """Every engine key of the config groups reaches EngineConfig (a key dropped on the way would silently run
    the default)."""
    engine, _, _ = _native_configs(overrides)
    assert {name: getattr(engine, name) for name in expected} == expected


@pytest.mark.parametrize(("args", "expected"), [
    (["+exp=depth_sweep"], ["-m", "+exp=depth_sweep"]),
    (["+exp=backend_compare", "engine=cpu"], ["-m", "+exp=backend_compare", "engine=cpu"]),
    (["+exp=quickstart"], ["+exp=quickstart"]),                           # declares no sweep
    (["-m", "+exp=depth_sweep"], ["-m", "+exp=depth_sweep"]),             # already a multirun
    (["--cfg", "job", "+exp=depth_sweep"], ["--cfg", "job", "+exp=depth_sweep"]),  # prints only
    (["pair=tiny_llama"], ["pair=tiny_llama"]),
])
def test_experiments_that_declare_a_sweep_run_as_multiruns(args, expected):
    from specexp.cli import run_args

    assert run_args(args) == expected
