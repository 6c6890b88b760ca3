"""The shared byte-level BPE tokenizer."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specexp.zoo import ZOO_DIR, ZOO_MODELS
from specexp.zoo.corpus import held_out_texts
from specexp.zoo.tokenizer import BOS_ID, EOS_ID, SHIPPED_TOKENIZER_PATH, VOCAB_SIZE, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_vocabulary_is_4096_with_pad_bos_eos_first(tokenizer):
    assert tokenizer.get_vocab_size() == VOCAB_SIZE == 4096
    assert [tokenizer.id_to_token(i) for i in range(3)] == ["<|pad|>", "<|bos|>", "<|eos|>"]


def test_encode_prepends_bos_and_nothing_else(tokenizer):
    ids = tokenizer.encode("def f(x):\n    return x\n").ids
    assert ids[0] == BOS_ID and BOS_ID not in ids[1:] and EOS_ID not in ids


def test_held_out_sources_round_trip_exactly(tokenizer):
    for text in list(held_out_texts())[:10]:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_without_special_token_strings_round_trips(text):
    assume("<|pad|>" not in text and "<|bos|>" not in text and "<|eos|>" not in text)
    tokenizer = load_tokenizer()
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_every_zoo_model_ships_the_same_tokenizer():
    shipped = SHIPPED_TOKENIZER_PATH.read_bytes()
    for name in ZOO_MODELS:
        path = ZOO_DIR / name / "tokenizer.json"
        if path.exists():
            assert path.read_bytes() == shipped, name
