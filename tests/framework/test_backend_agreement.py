"""hf and native run the same models — also for `pair.weights=random` — so their greedy outputs agree."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from specexp.cli import compose_config
from specexp.experiment import RunContext, execute

# Two backends on one pair, in full (about 30 s each on a 2-core CPU).
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("pair", ["tiny_random", "tiny_random_llama"])
def test_hf_and_native_agree_on_a_random_pair(tmp_path, pair):
    outputs = {}
    for backend in ("hf", "native"):
        cfg = compose_config(["+exp=quickstart", f"pair={pair}", "workload=random", "workload.num_prompts=2",
                              "workload.input_len=8", "workload.output_len=8", "tracking=disabled",
                              f"backend={backend}", "speculator.num_speculative_tokens=3"])
        record = execute(OmegaConf.to_container(cfg, resolve=True),
                         RunContext(run_dir=tmp_path / backend, experiment="quickstart"))
        assert record["status"] == "ok", record["error"]
        outputs[backend] = (tmp_path / backend / "outputs.jsonl").read_text()
    import json

    tokens = {b: [json.loads(line)["output_token_ids"] for line in text.splitlines()] for b, text in outputs.items()}
    assert tokens["hf"] == tokens["native"]
