"""``pair.weights: auto`` (the default): a model directory with safetensors is loaded, a config-only one is
randomly initialised, ``random`` forces random init; the run's first lines say which weights each model got.

A checkpoint path on the default random-weight pair used to be silently initialised at random."""

from __future__ import annotations

import json
import logging
import shutil

import torch
from cli_runs import TINY_RUN, run_cli


def greedy_tokens(model_dir, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """The target's own greedy continuation, computed with transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(num_tokens):
            next_id = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    return ids[0, len(prompt_ids):].tolist()


def run(tmp_path, *args):
    run_dir = tmp_path / "run"
    proc = run_cli(["run", *TINY_RUN, *args, f"hydra.run.dir={run_dir}"], tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((run_dir / "result.json").read_text())
    outputs = [json.loads(line) for line in (run_dir / "outputs.jsonl").read_text().splitlines()]
    return proc, record, outputs


def test_a_checkpoint_path_on_the_default_pair_loads_its_weights(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    proc, record, outputs = run(tmp_path, f"pair.target.path={tiny_llama_dir}",
                                f"pair.draft.path={tiny_llama_draft_dir}")
    assert record["config"]["pair"]["weights"] == "auto"
    assert record["weights"] == {"target": "trained", "draft": "trained"}
    first_lines = (proc.stdout + proc.stderr).splitlines()[:4]
    assert any(f"target {tiny_llama_dir}: trained weights" in line for line in first_lines), first_lines
    assert any(f"draft {tiny_llama_draft_dir}: trained weights" in line for line in first_lines), first_lines
    (output,) = outputs
    assert output["output_token_ids"] == greedy_tokens(tiny_llama_dir, output["prompt_token_ids"], 4)


def run_in_process(tmp_path, caplog, *args):
    """The same run through :func:`specexp.experiment.execute` (no subprocess); returns (log text, record,
    outputs)."""
    from omegaconf import OmegaConf

    from specexp.cli import compose_config
    from specexp.experiment import RunContext, execute

    cfg = OmegaConf.to_container(compose_config([*TINY_RUN, *args]), resolve=True)
    with caplog.at_level(logging.INFO, logger="specexp"):
        record = execute(cfg, RunContext(run_dir=tmp_path / "run", experiment="run"))
    assert record["status"] == "ok", record["error"]
    outputs = [json.loads(line) for line in (tmp_path / "run" / "outputs.jsonl").read_text().splitlines()]
    return caplog.text, record, outputs


def test_a_config_only_directory_gets_random_weights_and_says_so(tmp_path, caplog, tiny_llama_dir,
                                                                tiny_llama_draft_dir):
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(tiny_llama_draft_dir / name, config_only)
    text, record, _ = run_in_process(tmp_path, caplog, f"pair.target.path={tiny_llama_dir}",
                                     f"pair.draft.path={config_only}")
    assert record["weights"] == {"target": "trained", "draft": "random"}
    assert f"draft {config_only}: random weights (no *.safetensors" in text


def test_random_forces_random_weights_over_safetensors(tmp_path, caplog, tiny_llama_dir, tiny_llama_draft_dir):
    text, record, outputs = run_in_process(tmp_path, caplog, f"pair.target.path={tiny_llama_dir}",
                                           f"pair.draft.path={tiny_llama_draft_dir}", "pair.weights=random")
    assert record["weights"] == {"target": "random", "draft": "random"}
    assert "random weights (pair.weights=random)" in text
    (output,) = outputs
    assert output["output_token_ids"] != greedy_tokens(tiny_llama_dir, output["prompt_token_ids"], 4)
