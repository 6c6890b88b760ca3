"""The zoo recipe trains, checkpoints, and resumes where it stopped."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specexp.zoo.spec import TrainConfig, spec_from_dict
from specexp.zoo.train_loop import CHECKPOINT_NAME, lr_at, train

TINY_SIZE = {
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "max_position_embeddings": 128},
    "lfm2": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 1, "max_position_embeddings": 128, "conv_L_cache": 3,
                 "layer_types": ["conv", "full_attention"]},
}
TINY_TRAIN = {"steps": 6, "batch_size": 2, "seq_len": 32, "warmup_steps": 2, "eval_every_steps": 3, "eval_windows": 2,
                  "checkpoint_every_steps": 2, "log_every_steps": 1, "corpus_max_files": 2, "device": "cpu", "progress": False}


def tiny_spec(tmp_path, arch="llama", tag="run", teachers=(), **train_overrides):
    zoo = {"name": f"tiny-{arch}-{tag}", "arch": arch, "size": TINY_SIZE[arch], "teachers": list(teachers),
           "train": {**TINY_TRAIN, **train_overrides}}
    return spec_from_dict(zoo, {"out_dir": str(tmp_path / tag / "model"), "ckpt_dir": str(tmp_path / tag / "ckpt")})


def test_lr_warms_up_then_decays_to_min_ratio():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))


@pytest.mark.parametrize("arch", ["llama", "lfm2"])
def test_recipe_trains_and_saves_a_bf16_hf_directory(tmp_path, arch):
    result = train(tiny_spec(tmp_path, arch))
    assert result.finished and result.step == 6
    model_dir = result.out_dir
    weights = load_file(str(model_dir / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in weights.values())
    assert (model_dir / "tokenizer.json").exists()
    record = json.loads((model_dir / "training.json").read_text())
    assert record["tokens_seen"] == 6 * 2 * 32
    assert record["held_out_loss"] == pytest.approx(result.record["held_out_loss"])
    config = json.loads((model_dir / "config.json").read_text())
    if arch == "lfm2":
        assert config["conv_dim"] == config["block_dim"] == 32


def test_recipe_resumes_from_its_checkpoint_and_matches_an_uninterrupted_run(tmp_path):
    stopped = train(tiny_spec(tmp_path, tag="interrupted", stop_after_steps=3))
    assert not stopped.finished and stopped.step == 3
    assert torch.load(tmp_path / "interrupted" / "ckpt" / CHECKPOINT_NAME, weights_only=False)["step"] == 3

    resumed = train(tiny_spec(tmp_path, tag="interrupted"))
    assert resumed.finished and resumed.step == 6
    straight = train(tiny_spec(tmp_path, tag="straight"))
    a = load_file(str(resumed.out_dir / "model.safetensors"))
    b = load_file(str(straight.out_dir / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_distillation_trains_a_student_against_a_saved_teacher(tmp_path):
    teacher = train(tiny_spec(tmp_path, "llama", tag="teacher"))
    student = train(tiny_spec(tmp_path, "lfm2", tag="student", teachers=[str(teacher.out_dir)], steps=2))
    assert student.finished
    assert student.record["teachers"] == [str(teacher.out_dir)]


def test_checkpoint_of_another_architecture_is_refused(tmp_path):
    train(tiny_spec(tmp_path, "llama", tag="x", stop_after_steps=2))
    spec = tiny_spec(tmp_path, "lfm2", tag="x")
    with pytest.raises(ValueError, match="delete it or set a different ckpt_dir"):
        train(spec)


def test_keep_best_ships_the_weights_of_the_lowest_held_out_loss(tmp_path):
    result = train(tiny_spec(tmp_path, tag="best", keep_best=True, eval_every_steps=2))
    evals = [h for h in result.record["history"] if "held_out_loss" in h]
    best = min(evals, key=lambda h: h["held_out_loss"])
    assert result.record["selected_step"] == best["step"]
    assert result.record["held_out_loss"] == pytest.approx(best["held_out_loss"], abs=1e-4)
