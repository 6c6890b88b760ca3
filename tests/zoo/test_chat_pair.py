"""The chat demo pair's recipe: GSM8K's train split rendered with the zoo's chat template, the template shipped
in tokenizer_config.json, prompts at run time in exactly the format trained on, acceptance up to EOS."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from specexp.errors import ConfigError
from specexp.specs import WorkloadSpec, group_spec
from specexp.workloads import load_prompts
from specexp.workloads.chat_template import load_chat_template
from specexp.zoo import CHAT_DRAFTS, CHAT_TARGETS, ZOO_DIR
from specexp.zoo.acceptance import answer_length, walk_until_end
from specexp.zoo.chat_corpus import chat_template, gsm8k_pairs, gsm8k_streams, is_held_out, tokenizer_config
from specexp.zoo.measure import merge_rows
from specexp.zoo.spec import load_spec, spec_from_dict
from specexp.zoo.tokenizer import BOS_ID, EOS_ID, SHIPPED_TOKENIZER_PATH, load_tokenizer
from specexp.zoo.train_loop import train

PAIRS = [(f"Tom has {n} apples and buys {n + 3} more. How many apples does he have?",
          f"Tom has {n} + {n + 3} = <<{n}+{n + 3}={2 * n + 3}>>{2 * n + 3} apples.\n#### {2 * n + 3}") for n in range(60)]


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gsm8k") / "train.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in PAIRS))
    return path


def test_each_example_is_one_conversation_in_the_zoo_template(train_file):
    tokenizer = load_tokenizer()
    train_stream, held_out = gsm8k_streams(tokenizer, train_file)
    text = tokenizer.decode(train_stream.tolist(), skip_special_tokens=False)
    kept = [(q, a) for q, a in PAIRS if not is_held_out(q)]
    assert text == "".join(f"<|bos|>Question: {q}\nAnswer: {a}<|eos|>\n" for q, a in kept)
    assert int((train_stream == BOS_ID).sum()) == len(kept) == int((train_stream == EOS_ID).sum())
    assert int((held_out == BOS_ID).sum()) == len(PAIRS) - len(kept) > 0, "some questions are held out"


def test_the_run_time_prompt_is_exactly_the_trained_prefix(train_file, tmp_path):
    """A GSM8K prompt rendered by workload.chat_template=auto tokenizes to the start of the training
    conversation of the same question: the model is asked in the format it learned."""
    model_dir = tmp_path / "chat-model"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_bytes(SHIPPED_TOKENIZER_PATH.read_bytes())
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config()))
    spec = group_spec(WorkloadSpec, {"name": "gsm8k", "path": str(train_file), "chat_template": "auto"})
    prompts = load_prompts(spec, model_dir / "tokenizer.json", 4096, model_dir=model_dir)
    tokenizer = load_tokenizer()
    for prompt, (question, answer) in zip(prompts[:5], PAIRS, strict=False):
        trained = chat_template().render([{"role": "user", "content": question},
                                          {"role": "assistant", "content": answer}], add_generation_prompt=False)
        trained_ids = tokenizer.encode(trained, add_special_tokens=False).ids
        assert list(prompt.token_ids) == trained_ids[: len(prompt.token_ids)]
        assert prompt.text.endswith("\nAnswer:") and prompt.token_ids[0] == BOS_ID


def test_the_shipped_template_renders_as_transformers_does(tmp_path):
    from transformers import AutoTokenizer

    (tmp_path / "tokenizer.json").write_bytes(SHIPPED_TOKENIZER_PATH.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config()))
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": PAIRS[0][0]},
                {"role": "assistant", "content": PAIRS[0][1]}, {"role": "user", "content": "And twice that?"}]
    ours = load_chat_template("auto", tmp_path).encode(Tokenizer.from_file(str(tmp_path / "tokenizer.json")), messages)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert ours == (hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                    tuple(hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)))
    with pytest.raises(ConfigError, match="knows the roles system, user and assistant, not tool"):
        load_chat_template("auto", tmp_path).render([{"role": "tool", "content": "x"}])


def test_a_gsm8k_recipe_trains_and_ships_its_chat_template(train_file, tmp_path):
    zoo = {"name": "tiny-chat", "arch": "llama", "corpus": "gsm8k", "data_path": str(train_file),
           "size": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                    "num_key_value_heads": 1, "max_position_embeddings": 128},
           "train": {"steps": 2, "batch_size": 2, "seq_len": 32, "warmup_steps": 1, "eval_every_steps": 2,
                     "eval_windows": 2, "checkpoint_every_steps": 2, "device": "cpu", "progress": False}}
    result = train(spec_from_dict(zoo, {"out_dir": str(tmp_path / "model"), "ckpt_dir": str(tmp_path / "ckpt")}))
    assert json.loads((result.out_dir / "tokenizer_config.json").read_text()) == tokenizer_config()
    record = json.loads((result.out_dir / "training.json").read_text())
    assert record["corpus"].startswith("GSM8K train split") and "sha1(question)" in record["corpus_split"]
    assert load_chat_template("auto", result.out_dir).source.endswith("tokenizer_config.json")


def test_the_zoo_configs_train_on_gsm8k_from_a_file_the_user_passes():
    target, draft = load_spec("tiny_lfm2_gsm8k"), load_spec("tiny_llama_gsm8k_draft")
    assert (target.corpus, target.arch, draft.corpus, draft.arch) == ("gsm8k", "lfm2", "gsm8k", "llama")
    assert draft.teachers == [target.name] and target.data_path is None  # None: $SPECEXP_DATA_DIR/gsm8k/train.jsonl


def test_a_missing_or_bad_train_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"GSM8K train file .*nope.jsonl not found: set zoo.data_path"):
        gsm8k_pairs(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{"question": "q2"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: missing field 'answer'"):
        gsm8k_pairs(bad)


@given(match=st.lists(st.integers(0, 8), min_size=1, max_size=60), k=st.integers(1, 8), data=st.data())
def test_a_walk_to_eos_emits_exactly_the_answer(match, k, data):
    length = data.draw(st.integers(1, len(match)))
    match = [min(m, len(match) - i) for i, m in enumerate(match)]
    drafts, accepted = walk_until_end(match, length, k)
    assert drafts + accepted == length and 0 <= accepted <= k * drafts


def test_an_answer_ends_at_its_first_eos():
    assert answer_length([5, 6, EOS_ID, 7, EOS_ID], 10, (EOS_ID,)) == 3
    assert answer_length([5, 6, 7, 8], 3, (EOS_ID,)) == 3


def test_measuring_one_pair_keeps_the_other_pairs_rows(tmp_path):
    path = tmp_path / "acceptance.json"
    old = [{"target": "t", "draft": "d", "workload": "code", "acceptance_length": {"4": 3.0}},
           {"target": "c", "draft": "e", "workload": "gsm8k", "acceptance_length": {"4": 1.0}}]
    path.write_text(json.dumps(old))
    new = [{"target": "c", "draft": "e", "workload": "gsm8k", "acceptance_length": {"4": 2.7}}]
    assert merge_rows(path, new) == [old[0], new[0]]


def test_the_shipped_chat_pair_carries_the_zoo_template():
    for name in (*CHAT_TARGETS, *CHAT_DRAFTS):
        assert json.loads((ZOO_DIR / name / "tokenizer_config.json").read_text()) == tokenizer_config()


def test_the_chat_pair_reaches_acceptance_length_2_5_at_k4_on_held_out_gsm8k():
    rows = json.loads((ZOO_DIR / "acceptance.json").read_text())
    (row,) = [r for r in rows if (r["target"], r["draft"], r["workload"]) == (*CHAT_TARGETS, *CHAT_DRAFTS, "gsm8k")]
    assert row["acceptance_length"]["4"] >= 2.5
    card = (ZOO_DIR / CHAT_TARGETS[0] / "README.md").read_text()
    assert f"{row['acceptance_length']['4']:.2f}" in card and "python -m specexp run +exp=gsm8k" in card


def test_build_chat_trains_both_models_measures_to_eos_and_writes_their_cards(train_file, tmp_path, monkeypatch):
    """The one-command GPU build, run here with tiny sizes and a few steps into a scratch zoo."""
    from specexp.zoo import build_chat, spec

    tiny = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 256}
    real_load_spec = spec.load_spec

    def tiny_spec(name, **overrides):
        loaded = real_load_spec(name, **overrides)
        loaded.size = {**tiny, **({"conv_L_cache": 3, "layer_types": ["conv", "full_attention"]}
                                  if loaded.arch == "lfm2" else {})}
        loaded.train.batch_size, loaded.train.seq_len, loaded.train.eval_windows = 2, 32, 2
        loaded.train.device, loaded.train.progress = "cpu", False
        loaded.ckpt_dir = str(tmp_path / "ckpt" / loaded.name)
        return loaded

    monkeypatch.setattr(spec, "load_spec", tiny_spec)
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "gsm8k" / "train.jsonl").write_bytes(train_file.read_bytes())
    (data / "gsm8k" / "test.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                                                       for q, a in PAIRS[:4]))
    zoo = tmp_path / "zoo"
    build_chat.main(["--data-dir", str(data), "--zoo-dir", str(zoo), "--steps", "2", "--num-prompts", "3",
                     "--new-tokens", "8", "--out", str(tmp_path / "out")])
    (row,) = json.loads((zoo / "acceptance.json").read_text())
    assert (row["target"], row["draft"], row["workload"], row["num_prompts"]) == (*CHAT_TARGETS, *CHAT_DRAFTS,
                                                                                  "gsm8k", 3)
    assert set(row["acceptance_length"]) == {str(k) for k in range(1, 9)} and row["stop_at_eos"]
    draft_record = json.loads((zoo / CHAT_DRAFTS[0] / "training.json").read_text())
    assert draft_record["teachers"] == [str(zoo / CHAT_TARGETS[0])]
    for name in (*CHAT_TARGETS, *CHAT_DRAFTS):
        card = (zoo / name / "README.md").read_text()
        assert "GSM8K" in card and "| k=1 | k=2 |" in card and "+exp=gsm8k" in card
        assert (tmp_path / "out" / f"{name}.tar").is_file()
        assert json.loads((zoo / name / "tokenizer_config.json").read_text()) == tokenizer_config()
