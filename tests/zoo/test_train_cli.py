"""`specexp train` through the CLI: it writes under experiments/zoo/ (or out_dir), never into the shipped
zoo unless asked, and on a CPU it says how long the run will take before it starts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from specexp.zoo import ZOO_DIR
from specexp.zoo.spec import load_spec
from specexp.zoo.train_loop import output_dir

TINY = ["zoo.train.steps=2", "zoo.train.batch_size=2", "zoo.train.seq_len=32", "zoo.train.corpus_max_files=2",
        "zoo.train.eval_windows=2", "zoo.train.progress=false", "zoo.train.device=cpu",
        "zoo.size.hidden_size=32", "zoo.size.intermediate_size=64", "zoo.size.num_hidden_layers=2"]


def shipped_digests() -> dict[str, str]:
    return {str(p.relative_to(ZOO_DIR)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(ZOO_DIR.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def train_cli(cwd, *args):
    return subprocess.run([sys.executable, "-m", "specexp", "train", *args], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ), timeout=600, check=False)


@pytest.mark.slow
def test_train_writes_under_experiments_zoo_and_leaves_the_shipped_models_alone(tmp_path):
    before = shipped_digests()
    proc = train_cli(tmp_path, "+zoo=tiny_llama", *TINY, f"ckpt_dir={tmp_path / 'ckpt'}")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "experiments" / "zoo" / "tiny-llama"
    assert json.loads((out / "training.json").read_text())["steps"] == 2
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert shipped_digests() == before, "the shipped zoo must not change"
    # Before the first step: the CPU estimate and the GPU suggestion; after: how to use the new model.
    assert "on CPU one training step takes" in proc.stdout and "ETA" in proc.stdout
    assert "a CUDA GPU trains it" in proc.stdout
    assert proc.stdout.index("ETA") < proc.stdout.index("held-out loss")
    assert "pair.target.path=experiments/zoo/tiny-llama" in proc.stdout


@pytest.mark.slow
def test_train_into_the_shipped_zoo_is_refused_without_overwrite_shipped(tmp_path):
    before = shipped_digests()
    proc = train_cli(tmp_path, "+zoo=tiny_llama", *TINY, f"out_dir={ZOO_DIR / 'tiny-llama'}",
                     f"ckpt_dir={tmp_path / 'ckpt'}")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "+overwrite_shipped=true" in line and "Traceback" not in proc.stderr
    assert shipped_digests() == before


def test_train_without_a_zoo_model_names_the_choices_and_creates_nothing(tmp_path):
    proc = train_cli(tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("specexp: error: no zoo model chosen: add +zoo=NAME, one of tiny_lfm2, "
                                   "tiny_lfm2_draft, tiny_lfm2_gsm8k, tiny_llama, tiny_llama_draft, "
                                   "tiny_llama_gsm8k_draft")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out_dir", [None, "elsewhere/model"])
def test_output_dir_is_the_shipped_zoo_only_when_overwrite_shipped(out_dir):
    spec = load_spec("tiny_lfm2")
    spec.out_dir = out_dir
    assert output_dir(spec, overwrite_shipped=True) == ZOO_DIR / "tiny-lfm2"
    expected = out_dir or os.path.join("experiments", "zoo", "tiny-lfm2")
    assert str(output_dir(spec)) == expected
