"""Loading: where models are found, which checkpoints are accepted, dtypes, random weights, zoo shapes,
tokenizers, and what the models package may import."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest
import torch
from checkpoints import CASES, build_checkpoint
from harness import PagedRunner

from specexp.models import (
    ForwardContext,
    ModelConfig,
    UnsupportedModelError,
    allocate_conv_states,
    allocate_kv_caches,
    load_model,
    load_tokenizer,
)
from specexp.models.loader import ZOO_DIR

ZOO_CONFIGS = ["lfm2-1.2b", "lfm2-350m", "llama-3.2-1b", "llama-100m-draft"]


def logits_of(model, tokens):
    return PagedRunner(model).step([("a", tokens)])["a"]


TOKENS = [5, 17, 42, 99, 7, 250, 31, 64, 12]


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path, case_cache):
    single = case_cache("lfm2-L3-gqa-tied-cacb")
    family, overrides = CASES[single.id]
    sharded = tmp_path / "sharded"
    build_checkpoint(sharded, family, overrides, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    torch.testing.assert_close(logits_of(load_model(sharded), TOKENS), logits_of(load_model(single.path), TOKENS))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, "bf16"])
def test_half_precision_loads_and_stays_near_fp32(case_cache, dtype):
    case = case_cache("llama-gqa-tied-llama3rope")
    half = load_model(case.path, dtype=dtype)
    assert all(p.dtype in (torch.bfloat16, torch.float16) for p in half.parameters())
    assert half.model.rotary_emb.inv_freq.dtype == torch.float32
    runner = PagedRunner(half, dtype=next(half.parameters()).dtype)
    logits = runner.step([("a", TOKENS)])["a"]
    assert logits.dtype == torch.float32
    assert (logits - logits_of(load_model(case.path), TOKENS)).abs().max() < 0.25


@pytest.mark.parametrize("case_id", ["llama-gqa-tied-llama3rope", "llama-mha-untied"])
def test_tied_head_is_the_embedding_matrix(case_cache, case_id):
    model = load_model(case_cache(case_id).path)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == model.config.tie_word_embeddings


def test_hub_id_resolves_from_the_local_hf_cache(tmp_path, monkeypatch, case_cache):
    case = case_cache("qwen2-gqa-qkvbias")
    repo = tmp_path / "hub" / "models--tiny-org--tiny-qwen"
    shutil.copytree(case.path, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model = load_model("tiny-org/tiny-qwen")
    assert model.config.model_type == "qwen2"
    torch.testing.assert_close(logits_of(model, TOKENS), logits_of(load_model(case.path), TOKENS))
    assert load_tokenizer("tiny-org/tiny-qwen").get_vocab_size() == 320


def test_hf_home_is_searched_too(tmp_path, monkeypatch, case_cache):
    case = case_cache("llama-mha-untied")
    shutil.copytree(case.path, tmp_path / "home" / "hub" / "models--o--m" / "snapshots" / "rev")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert load_model("o/m").config.num_kv_heads == 4


def test_missing_model_names_every_place_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache-a"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home-b"))
    with pytest.raises(FileNotFoundError) as err:
        load_model("no-org/no-model")
    message = str(err.value)
    for place in ["local directory no-org/no-model", str(ZOO_DIR / "no-org/no-model"),
                  str(ZOO_DIR / "configs" / "no-org/no-model"), str(tmp_path / "cache-a"),
                  str(tmp_path / "home-b" / "hub"), ".cache/huggingface/hub"]:
        assert place in message
    assert "network" in message


def test_unsupported_architecture_lists_what_is_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModelError) as err:
        load_model(tmp_path, weights="random")
    for name in ["gpt2", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Lfm2ForCausalLM"]:
        assert name in str(err.value)


def test_unsupported_options_are_refused(case_cache):
    hf = json.loads((case_cache("llama-mha-untied").path / "config.json").read_text())
    with pytest.raises(UnsupportedModelError, match="rope_type 'yarn'"):
        ModelConfig.from_hf({**hf, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}})
    with pytest.raises(UnsupportedModelError, match="hidden_act"):
        ModelConfig.from_hf({**hf, "hidden_act": "gelu"})
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        ModelConfig.from_hf({**hf, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                             "use_sliding_window": True, "layer_types": ["sliding_attention", "full_attention"]})


def test_checkpoint_that_does_not_match_its_config_is_refused(tmp_path, case_cache):
    case = case_cache("llama-mha-untied")
    shutil.copytree(case.path, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["intermediate_size"] = 80
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"mlp\.\w+_proj\.weight has shape"):
        load_model(tmp_path / "m")


def test_config_only_directory_needs_weights_random(tmp_path):
    shutil.copy(ZOO_DIR / "configs" / "llama-100m-draft" / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="weights='random'"):
        load_model(tmp_path)


def test_legacy_config_fields_are_read():
    lfm2 = ModelConfig.from_hf({
        "model_type": "lfm2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "full_attn_idxs": [1, 3], "block_ff_dim": 96, "intermediate_size": 7,
        "block_auto_adjust_ff_dim": True, "block_multiple_of": 16, "tie_embedding": False,
        "tie_word_embeddings": True, "rope_theta": 1234.0, "conv_L_cache": 4,
    })
    assert lfm2.layer_types == ["conv", "attention", "conv", "attention"]
    assert lfm2.intermediate_size == 64  # int(2 * 96 / 3) = 64, rounded up to 16
    assert not lfm2.tie_word_embeddings and lfm2.rope.theta == 1234.0 and lfm2.conv_L_cache == 4
    llama = ModelConfig.from_hf({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "rope_theta": 5e5, "eos_token_id": [7, 9],
        "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    }, generation={"eos_token_id": [9, 11]})
    assert llama.rope.rope_type == "llama3" and llama.rope.theta == 5e5 and llama.rope.factor == 32.0
    assert llama.num_kv_heads == 4 and llama.head_dim == 8
    assert llama.eos_token_ids == [7, 9, 11] and llama.eos_token_id == 7


def test_random_weights_are_seeded_and_need_no_weight_files(case_cache):
    case = case_cache("lfm2-L4-mha-untied-bias-acc")
    a = load_model(case.path, weights="random", seed=3)
    b = load_model(case.path, weights="random", seed=3)
    c = load_model(case.path, weights="random", seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if "norm" in name:
            assert (pa == 1).all(), name
        elif name.endswith("bias"):
            assert (pa == 0).all(), name
        else:
            assert not torch.equal(pa, pc), name
            assert 0.01 < pa.std().item() < 0.03, name  # initializer_range 0.02
    assert torch.isfinite(logits_of(a, TOKENS)).all()


@pytest.mark.parametrize("name", ZOO_CONFIGS)
def test_zoo_configs_have_the_published_shapes(name):
    """Parameter counts equal transformers' own model of the same config.json (built on the meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    native = load_model(name, device="meta", weights="random")
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ZOO_DIR / "configs" / name))
    assert native.num_parameters() == sum(p.numel() for p in reference.parameters())
    published_millions = {"lfm2-1.2b": 1170, "lfm2-350m": 354, "llama-3.2-1b": 1236, "llama-100m-draft": 97}
    assert round(native.num_parameters() / 1e6) == published_millions[name]
    if name.startswith("lfm2"):
        assert native.conv_layer_ids == [0, 1, 3, 4, 6, 7, 9, 11, 13, 15]
        assert native.attention_layer_ids == [2, 5, 8, 10, 12, 14]
        assert native.conv_state_shape(5, 4) == (5, native.config.hidden_size, 2 + 4)


def test_draft_shares_the_target_vocabulary():
    target = load_model("llama-3.2-1b", device="meta", weights="random").config
    draft = load_model("llama-100m-draft", device="meta", weights="random").config
    assert draft.vocab_size == target.vocab_size and draft.eos_token_ids == target.eos_token_ids


def test_cache_allocation_follows_the_layer_kinds(case_cache):
    model = load_model(case_cache("lfm2-L3-ccac-multiplier").path)
    kv = allocate_kv_caches(model, num_blocks=9, block_size=4, device="cpu", dtype=torch.float32)
    conv = allocate_conv_states(model, num_slots=5, num_spec_tokens=3, device="cpu", dtype=torch.float32)
    assert model.attention_layer_ids == [2] and model.conv_layer_ids == [0, 1, 3]
    assert [t.shape for t in kv] == [(2, 9, 4, 2, 12)]
    assert [t.shape for t in conv] == [(5, 48, 2 + 3)] * 3
    assert all((t == 0).all() for t in kv + conv)
    with pytest.raises(ValueError, match="KV caches"):
        model(torch.tensor([1]), torch.tensor([0]), ForwardContext(attn=None, conv=None, kv_caches=kv))


def test_tokenizer_round_trips_text(case_cache):
    tokenizer = load_tokenizer(case_cache("llama-mha-untied").path)
    text = "def add(a, b):\n    return a + b  # speculative decoding, ünïcødé too"
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text
    assert max(ids) < 320


def test_models_package_imports_only_torch_safetensors_tokenizers():
    code = (
        "import sys, specexp.models, specexp.models.loader;"
        "bad = {'transformers', 'hydra', 'omegaconf', 'wandb', 'pandas'} & {m.split('.')[0] for m in sys.modules};"
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["tiny-lfm2", "tiny-llama-draft"])
def test_building_a_model_imports_no_compiler(name):
    """A run's start-up: building on the meta device, then loading, must not reach torch's Python references
    (their first use imports torch._dynamo and symbolic shapes, ~1.3 s on a CPU). Weights equal a second load's."""
    code = (
        "import sys, torch; from specexp.models import load_model; from specexp.zoo import ZOO_DIR;"
        f"a = load_model(ZOO_DIR / {name!r}); b = load_model(ZOO_DIR / {name!r});"
        "same = all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()));"
        "freq = [m.inv_freq for m in a.modules() if hasattr(m, 'inv_freq')];"
        "print(same, all(f.dtype == torch.float32 and f.device.type == 'cpu' for f in freq) and len(freq) > 0,"
        " sorted(m for m in ('torch._dynamo', 'torch.fx.experimental.symbolic_shapes') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True True []"


@pytest.mark.parametrize("case_id", ["llama-gqa-tied-llama3rope", "lfm2-L3-gqa-tied-cacb"])
def test_whole_forward_is_sync_free(case_cache, case_id):
    """The full model forward runs on the meta device: no `.item()`, no data-dependent shapes."""
    case = case_cache(case_id)
    runner = PagedRunner(load_model(case.path))
    inputs = runner.prepare([("a", [5, 6, 7]), ("b", [8])], pad_rows=1, pad_tokens=2)
    to_meta = lambda t: torch.empty_like(t, device="meta") if isinstance(t, torch.Tensor) else t  # noqa: E731
    on_meta = lambda md: dataclasses.replace(  # noqa: E731
        md, **{f.name: to_meta(getattr(md, f.name)) for f in dataclasses.fields(md)})
    ctx = inputs.ctx
    meta_ctx = ForwardContext(on_meta(ctx.attn), on_meta(ctx.conv), [to_meta(t) for t in ctx.kv_caches],
                              [to_meta(t) for t in ctx.conv_states])
    model = load_model(case.path, device="meta")
    with torch.no_grad():
        hidden = model(to_meta(inputs.input_ids), to_meta(inputs.positions), meta_ctx)
    assert hidden.shape == (6, model.config.hidden_size)
