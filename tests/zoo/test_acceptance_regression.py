"""Acceptance regression: each shipped pair's greedy acceptance length at k=3 on a fixed 32-prompt slice
of the ``code`` workload, run through the experiment API (native backend, CPU), pinned within 5%.

The prompts come from the shipped, frozen stdlib blocks (``specexp/workloads/data/``), so the pins hold on
every Python version (recompute them with ``python tests/zoo/test_acceptance_regression.py`` after a
deliberate change of the models or the frozen blocks).
"""

from __future__ import annotations

import sys

import pytest

K = 3
SETTINGS = ["+exp=quickstart", "workload=code", "workload.num_prompts=32", "workload.input_len=128",
            "sampling.max_new_tokens=32", "sampling.ignore_eos=true", f"speculator.num_speculative_tokens={K}",
            "backend=native", "engine=cpu", "tracking=disabled"]
PINNED_ACCEPTANCE_LENGTH = {  # measured with SETTINGS on CPython 3.11.7, CPU, native backend
    "tiny_lfm2": 2.4303,
    "tiny_lfm2_hybrid": 2.7762,
    "tiny_llama": 2.7819,
}


def measure_acceptance_length(pair: str, run_dir) -> float:
    from omegaconf import OmegaConf

    from specexp.cli import compose_config
    from specexp.experiment import RunContext, execute

    cfg = OmegaConf.to_container(compose_config([*SETTINGS, f"pair={pair}"]), resolve=True)
    record = execute(cfg, RunContext(run_dir=run_dir, experiment="acceptance_regression"))
    assert record["status"] == "ok", record["error"]
    return record["metrics"]["acceptance_length"]


@pytest.mark.slow
@pytest.mark.parametrize("pair", sorted(PINNED_ACCEPTANCE_LENGTH))
def test_pair_acceptance_length_at_k3_on_code_is_pinned(pair, tmp_path):
    measured = measure_acceptance_length(pair, tmp_path)
    assert measured == pytest.approx(PINNED_ACCEPTANCE_LENGTH[pair], rel=0.05), (
        f"{pair}: acceptance length at k={K} on code is {measured:.3f}, pinned "
        f"{PINNED_ACCEPTANCE_LENGTH[pair]:.3f} (rel tol 5%)")


if __name__ == "__main__":  # print fresh pins
    import tempfile

    for name in sys.argv[1:] or sorted(PINNED_ACCEPTANCE_LENGTH):
        with tempfile.TemporaryDirectory() as d:
            print(f'    "{name}": {measure_acceptance_length(name, d):.4f},', flush=True)
