"""``engine.max_model_len=auto`` fits the length to the workload, and every backend records where its start-up
time went (``metrics.startup_s``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from specexp.cli import compose_config
from specexp.experiment import RunContext, execute
from specexp.run_spec import auto_max_model_len, build_run_spec
from specexp.startup import PhaseClock, format_startup, process_age_s, startup_record
from specexp.workloads.prompt import Prompt


def prompt(n: int, turns: int = 1) -> Prompt:
    return Prompt(id=f"p{n}", text="", token_ids=tuple(range(n)), num_turns=turns)


@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=6), new=st.integers(1, 200),
       k=st.integers(0, 8), block=st.sampled_from([1, 8, 16, 32]), budget=st.integers(600, 4096))
def test_auto_length_holds_the_longest_request_rounded_up_to_a_block(lengths, new, k, block, budget):
    length = auto_max_model_len([prompt(n) for n in lengths], new, k, block, budget)
    need = max(lengths) + new + k
    assert length % block == 0 or length == budget
    assert need <= length <= budget
    assert length - need < block or length == budget


def test_auto_length_is_capped_and_keeps_the_cap_for_multi_turn_workloads():
    assert auto_max_model_len([prompt(100), prompt(30)], 64, 4, 16, 2048) == 176  # 168 rounded up
    assert auto_max_model_len([prompt(100)], 64, 4, 16, 150) == 150
    assert auto_max_model_len([prompt(10, turns=2)], 64, 4, 16, 2048) == 2048


def config(*overrides: str) -> dict:
    cfg = compose_config(["+exp=quickstart", "tracking=disabled", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_the_default_length_is_fitted_to_the_prompts_and_an_explicit_one_is_kept(tmp_path):
    ctx = RunContext(run_dir=tmp_path / "run", experiment="quickstart")
    spec = build_run_spec(config("sampling.max_new_tokens=24", "speculator.num_speculative_tokens=3"), ctx)
    longest = max(len(p.token_ids) for p in spec.prompts)
    assert spec.config["engine"]["max_model_len"] == "auto"
    assert spec.engine.max_model_len == -(-(longest + 24 + 3) // spec.engine.block_size) * spec.engine.block_size
    spec = build_run_spec(config("engine.max_model_len=512"), ctx)
    assert spec.engine.max_model_len == 512


def test_a_bad_length_names_the_value_and_auto(tmp_path):
    from specexp.errors import ConfigError

    with pytest.raises(ConfigError, match=r"engine.max_model_len='long' is not valid: use auto or an integer >= 2"):
        build_run_spec(config("engine.max_model_len=long"), RunContext(run_dir=tmp_path, experiment="quickstart"))


def test_startup_record_sums_the_known_parts():
    record = startup_record({"model_load": 1.0, "engine_build": 0.5, "warmup": 0.25}, None, graph_capture_s=0.4)
    assert record == {"import": None, "model_load": 1.0, "engine_build": 0.5, "warmup": 0.25,
                      "graph_capture": 0.4, "total": 1.75}
    assert format_startup(record) == ("model_load 1.0 s · engine_build 0.5 s · warmup 0.2 s = 1.8 s"
                                      " (graph capture 0.4 s)")
    record = startup_record({"model_load": 1.0, "engine_build": 8.0, "warmup": 0.25}, 2.0, graph_capture_s=7.5,
                            compile_s=6.0)
    assert record["compile"] == 6.0 and record["total"] == 11.25
    assert format_startup(record) == ("import 2.0 s · model_load 1.0 s · engine_build 8.0 s · warmup 0.2 s = 11.2 s"
                                      " (graph capture 7.5 s, of it compiling 6.0 s)")
    clock = PhaseClock()
    assert clock.lap("a") >= 0 and list(clock.phases_s) == ["a"]


def test_a_native_run_records_its_length_and_startup_breakdown(tmp_path):
    record = execute(config("workload.num_prompts=2", "sampling.max_new_tokens=4"),
                     RunContext(run_dir=tmp_path, experiment="quickstart"))
    saved = json.loads((tmp_path / "result.json").read_text())
    assert record["status"] == "ok" and saved["max_model_len"] % 16 == 0 and saved["max_model_len"] < 2048
    startup = saved["metrics"]["startup_s"]
    assert set(startup) >= {"import", "model_load", "engine_build", "warmup", "total"}
    age = process_age_s()
    assert age is None or 0 <= startup["import"] <= age
    parts = [startup[key] for key in ("import", "model_load", "engine_build", "warmup") if startup[key] is not None]
    assert all(part >= 0 for part in parts) and startup["total"] == pytest.approx(sum(parts))
