"""The shipped zoo: every model loads (transformers and the native engine), is the size its card says,
and the whole zoo stays small enough to ship."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specexp.zoo import CHAT_DRAFTS, CHAT_TARGETS, DRAFTS, TARGETS, ZOO_DIR, ZOO_MODELS
from specexp.zoo.architectures import count_parameters
from specexp.zoo.tokenizer import VOCAB_SIZE, load_tokenizer

MAX_ZOO_BYTES = 60_000_000


@pytest.fixture(scope="module", params=ZOO_MODELS)
def name(request):
    return request.param


def test_model_loads_in_transformers_with_finite_logits(name):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ZOO_DIR / name, dtype=torch.float32).eval()
    ids = torch.tensor([load_tokenizer(ZOO_DIR / name).encode("def add(a, b):\n    return").ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], VOCAB_SIZE)
    assert torch.isfinite(logits).all()
    record = json.loads((ZOO_DIR / name / "training.json").read_text())
    assert count_parameters(model) == record["parameters"]


def test_model_loads_in_the_native_engine(name):
    from specexp.models import load_model

    model = load_model(name, dtype=torch.float32, device="cpu")
    hf = json.loads((ZOO_DIR / name / "config.json").read_text())
    assert model.config.num_hidden_layers == hf["num_hidden_layers"]
    assert model.config.vocab_size == VOCAB_SIZE


def test_weights_are_bf16_safetensors_with_tied_embeddings(name):
    weights = load_file(str(ZOO_DIR / name / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert not any(key.startswith("lm_head") for key in weights), "the LM head is tied to the embedding"


def test_targets_hold_6_to_10m_and_drafts_1_to_2m_parameters_in_60_mb():
    params = {n: json.loads((ZOO_DIR / n / "training.json").read_text())["parameters"] for n in ZOO_MODELS}
    assert all(6e6 <= params[n] <= 10e6 for n in (*TARGETS, *CHAT_TARGETS)), params
    assert all(1e6 <= params[n] <= 2e6 for n in (*DRAFTS, *CHAT_DRAFTS)), params
    total_bytes = sum(f.stat().st_size for f in ZOO_DIR.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    assert total_bytes <= MAX_ZOO_BYTES, f"the zoo is {total_bytes / 1e6:.1f} MB, more than 60 MB"


def test_lfm2_models_are_hybrid_and_carry_vllm_fields():
    for name in ("tiny-lfm2", "tiny-lfm2-draft"):
        config = json.loads((ZOO_DIR / name / "config.json").read_text())
        assert {"conv", "full_attention"} == set(config["layer_types"])
        assert config["conv_L_cache"] == 3
        assert config["conv_dim"] == config["block_dim"] == config["hidden_size"]


def test_cards_report_acceptance_at_k1_to_8_against_each_target(name):
    card = (ZOO_DIR / name / "README.md").read_text()
    assert "| k=1 | k=2 | k=3 | k=4 | k=5 | k=6 | k=7 | k=8 |" in card
    for target in TARGETS:
        if name in DRAFTS or name == target:
            assert f"| {target} |" in card
    for field in ("parameters", "tokens seen", "held-out loss", "hardware", "seed", "corpus"):
        assert f"| {field} |" in card


def test_every_pair_reaches_acceptance_length_2_5_at_k4_on_code():
    rows = json.loads((ZOO_DIR / "acceptance.json").read_text())
    pairs = {("tiny-lfm2", "tiny-llama-draft"), ("tiny-lfm2", "tiny-lfm2-draft"), ("tiny-llama", "tiny-llama-draft")}
    shipped = {(r["target"], r["draft"]): r for r in rows if r["workload"] == "code"}
    for pair in pairs:
        assert shipped[pair]["acceptance_length"]["4"] >= 2.5, pair
