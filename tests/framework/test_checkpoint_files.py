"""Corrupted, truncated or empty weight files are named (file, and whether it is the target's or the draft's)
before either model loads; one architecture list serves the pre-check and the loader."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
from cli_runs import TINY_RUN, error_line, run_cli, run_dirs

from specexp import launch
from specexp.errors import ConfigError
from specexp.models.checkpoint_files import CheckpointFileError, check_safetensors, find_weight_files
from specexp.models.config import SUPPORTED_ARCHITECTURES


def pair_args(target, draft):
    return ["pair=local", f"pair.target.path={target}", f"pair.draft.path={draft}"]


def plan_error(args) -> str:
    with pytest.raises(ConfigError) as info:
        launch.plan_run(["run", *TINY_RUN, *args])
    assert "\n" not in str(info.value)
    return str(info.value)


def damaged_copy(source, dest, damage):
    shutil.copytree(source, dest)
    damage(dest / "model.safetensors")
    return dest


def empty(path):
    path.write_bytes(b"")


def truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def header_cut(path):
    path.write_bytes(path.read_bytes()[:20])


def garbled_header(path):
    data = bytearray(path.read_bytes())
    data[9:15] = b"\xff\xfe!!{{"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("damage", "fragment"), [
    (empty, "is empty (0 bytes)"),
    (truncated, "is truncated: tensor"),
    (header_cut, "is truncated or not a safetensors file"),
    (garbled_header, "header is not valid JSON"),
])
@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_damaged_weight_file_is_named_before_any_model_loads(tmp_path, tiny_llama_dir, tiny_llama_draft_dir,
                                                               damage, fragment, role, monkeypatch):
    from specexp.models import loader

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the checkpoints were checked")

    monkeypatch.setattr(loader, "load_weights_", no_loading)
    good = {"target": tiny_llama_dir, "draft": tiny_llama_draft_dir}
    good[role] = damaged_copy(good[role], tmp_path / f"damaged-{role}", damage)
    message = plan_error(pair_args(good["target"], good["draft"]))
    assert message.startswith(f"{role} checkpoint: {good[role] / 'model.safetensors'}"), message
    assert fragment in message, message


def test_cli_names_a_truncated_draft_with_exit_2_and_no_directory(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    draft = damaged_copy(tiny_llama_draft_dir, tmp_path / "draft", truncated)
    runs = tmp_path / "runs"
    proc = run_cli(["run", *TINY_RUN, *pair_args(tiny_llama_dir, draft)], runs)
    assert proc.returncode == 2
    line = error_line(proc)
    assert "draft checkpoint" in line and str(draft / "model.safetensors") in line and "truncated" in line
    assert run_dirs(runs) == []


def test_every_shipped_checkpoint_passes_the_header_check():
    from specexp.pairs import ZOO_DIR

    files = [f for d in ZOO_DIR.iterdir() if d.is_dir() for f in find_weight_files(d)]
    assert len(files) >= 4
    for path in files:
        assert check_safetensors(path) > 0


def test_a_sharded_index_naming_a_missing_shard_is_refused(tmp_path, tiny_llama_draft_dir):
    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_llama_draft_dir, sharded)
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    with pytest.raises(CheckpointFileError, match="model-00002-of-00002.safetensors is missing"):
        for path in find_weight_files(sharded):
            check_safetensors(path)


def test_a_header_whose_sizes_disagree_with_its_shapes_is_refused(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}}).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(32))
    with pytest.raises(CheckpointFileError, match=r"tensor 'w' \(F32 \[4, 4\]\) needs 64 bytes"):
        check_safetensors(path)


def test_only_pytorch_bin_weights_are_named(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    draft = tmp_path / "bin-draft"
    shutil.copytree(tiny_llama_draft_dir, draft)
    (draft / "model.safetensors").rename(draft / "pytorch_model.bin")
    message = plan_error(pair_args(tiny_llama_dir, draft))
    assert "draft checkpoint" in message and "pytorch_model*.bin" in message and "safetensors" in message


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_every_architecture_the_loader_supports_passes_the_pre_check(tmp_path, tiny_tokenizer_path, model_type):
    """The pre-check reads config.json with the loader's own ModelConfig (it used to refuse Qwen2/Qwen3)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from specexp.models import load_model

    config = AutoConfig.for_model(model_type, vocab_size=384, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  max_position_embeddings=2048, tie_word_embeddings=False)
    torch.manual_seed(0)
    model_dir = tmp_path / model_type
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    shutil.copy(tiny_tokenizer_path, model_dir / "tokenizer.json")
    architecture = json.loads((model_dir / "config.json").read_text())["architectures"][0]
    assert architecture in SUPPORTED_ARCHITECTURES
    plan = launch.plan_run(["run", *TINY_RUN, *pair_args(model_dir, model_dir)])
    assert plan.jobs[0].spec.pair.target.architecture == architecture
    assert plan.jobs[0].spec.pair.target.weights == "trained"
    load_model(model_dir)  # and the loader builds it


@pytest.mark.parametrize(("change", "fragments"), [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     ["rope_type 'yarn' is not implemented by the native engine", "supported: default, llama3"]),
    ({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}, ["'gpt_neox'", "LlamaForCausalLM"]),
    ({"hidden_act": "gelu"}, ["hidden_act 'gelu' not supported"]),
])
def test_model_settings_the_engine_lacks_are_refused_before_loading(tmp_path, tiny_llama_dir, tiny_llama_draft_dir,
                                                                    change, fragments):
    target = tmp_path / "target"
    shutil.copytree(tiny_llama_dir, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **change}))
    message = plan_error(pair_args(target, tiny_llama_draft_dir))
    assert message.startswith("target checkpoint: ") and all(f in message for f in fragments), message
