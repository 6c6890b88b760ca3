"""The depth keys through the app layer: +exp=dynamic_depth's jobs, the speculator/depth options on the command
line, and one line (exit 2 at the CLI) for every bad depth setting, before anything loads."""

from __future__ import annotations

import pytest
from cli_runs import TINY_RUN

from specexp import launch
from specexp.errors import ConfigError

STATIC = (1, 2, 3, 4, 6, 8)


def test_the_experiment_runs_static_k_beside_each_dynamic_mode_at_every_batch_size():
    plan = launch.plan_run(["run", "+exp=dynamic_depth", "engine=cpu"])
    jobs = [(j.config["engine"]["max_num_seqs"], j.config["speculator"]) for j in plan.jobs]
    assert len(jobs) == 4 * (len(STATIC) + 3)
    for batch in (1, 4, 16, 64):
        specs = [s for b, s in jobs if b == batch]
        static = sorted(s["num_speculative_tokens"] for s in specs if s["adaptive"] == "off"
                        and not s["draft_confidence_threshold"] and s["num_speculative_tokens_per_batch_size"] is None)
        assert static == list(STATIC)
        assert sum(s["adaptive"] == "goodput" for s in specs) == 1
        assert sum(s["draft_confidence_threshold"] > 0 for s in specs) == 1
        assert sum(s["num_speculative_tokens_per_batch_size"] is not None for s in specs) == 1
    assert all(j.config["workload"]["num_prompts"] >= 2 * 64 for j in plan.jobs)


def test_a_depth_option_can_be_chosen_on_the_command_line():
    plan = launch.plan_run(["run", *TINY_RUN, "+speculator/depth=goodput"])
    assert plan.jobs[0].config["speculator"]["adaptive"] == "goodput"
    with pytest.raises(ConfigError, match="did you mean goodput"):
        launch.plan_run(["run", *TINY_RUN, "+speculator/depth=goodptu"])


@pytest.mark.parametrize("overrides, fragment", [
    (["speculator.num_speculative_tokens_per_batch_size=[[1,4,3],[3,8,2]]"],
     "speculator.num_speculative_tokens_per_batch_size[1]=[3, 8, 2]: overlaps [1, 4, 3]"),
    (["speculator.num_speculative_tokens_per_batch_size=[[1,4,3],[9,12,1],[5,8,2]]"],
     "[2]=[5, 8, 2]: ranges must be sorted by start_bs"),
    (["speculator.num_speculative_tokens_per_batch_size=[[2,4,3]]"], "the first range must start at batch size 1"),
    (["speculator.num_speculative_tokens_per_batch_size=[[1,4,-2]]"], "k=-2 must be >= 0"),
    (["speculator.num_speculative_tokens_per_batch_size=[[1,4,9]]"], "k=9 > speculator.num_speculative_tokens=4"),
    (["speculator.adaptive=goodput", "speculator.draft_confidence_threshold=0.3"],
     "speculator.draft_confidence_threshold and speculator.adaptive are both set"),
    (["speculator.adaptive=always"], "speculator.adaptive='always' is not valid: use one of off, goodput"),
    (["speculator.draft_confidence_threshold=2"], "speculator.draft_confidence_threshold=2 is not valid"),
    (["speculator.adaptive=goodput", "backend=hf"], "is implemented by backend native only (backend=hf)"),
])
def test_each_bad_depth_setting_is_one_line_naming_it(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        launch.plan_run(["run", *TINY_RUN, *overrides])
    assert "\n" not in str(info.value) and fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("overrides, fragment", [
    (["speculator.adaptive=goodput", "speculator.goodput_prior_acceptance=1.0"],
     "speculator.goodput_prior_acceptance=1.0: must be in (0, 1)"),
    (["speculator.adaptive=goodput", "speculator.goodput_ema_weight=0"],
     "speculator.goodput_ema_weight=0: must be in (0, 1]"),
    (["speculator.goodput_prior_acceptance=0.5"],
     "speculator.goodput_prior_acceptance=0.5 is set but speculator.adaptive='off'"),
    (["speculator.adaptive=goodput", "speculator.goodput_ema_weight=-1"], "goodput_ema_weight=-1"),
])
def test_each_bad_goodput_estimator_setting_is_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        launch.plan_run(["run", *TINY_RUN, *overrides])
    assert "\n" not in str(info.value) and fragment in str(info.value), str(info.value)


def test_the_goodput_estimator_settings_reach_the_depth_policy():
    from specexp.engine.config import SpeculatorConfig
    from specexp.engine.depth import depth_policy
    from specexp.engine.goodput import GoodputSettings
    from specexp.engine_settings import engine_configs

    plan = launch.plan_run(["run", *TINY_RUN, "speculator.adaptive=goodput", "speculator.goodput_prior_acceptance=0.5",
                            "speculator.goodput_ema_weight=0.2"])
    _, speculator, _ = engine_configs(plan.jobs[0].spec)
    policy = depth_policy(speculator, speculator.num_speculative_tokens)
    assert policy.settings == GoodputSettings(prior_acceptance=0.5, ema_weight=0.2)
    assert policy.run_estimate.conditional == [0.5] * speculator.num_speculative_tokens
    assert SpeculatorConfig().goodput_settings() == GoodputSettings()  # the defaults are the estimator's
