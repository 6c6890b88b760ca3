"""Workloads: random token ids and jsonl prompts, tokenized with the target's tokenizer.json."""

import json

import pytest
from tokenizers import Tokenizer

from specexp.errors import ConfigError
from specexp.specs import WorkloadSpec
from specexp.workloads import load_prompts


def test_random_prompts_are_seeded_and_free_of_special_tokens(tiny_tokenizer_path):
    spec = WorkloadSpec(name="random", num_prompts=3, input_len=17, seed=5)
    a = load_prompts(spec, tiny_tokenizer_path, vocab_size=384)
    b = load_prompts(spec, tiny_tokenizer_path, vocab_size=384)
    assert a == b
    assert [len(p.token_ids) for p in a] == [17, 17, 17]
    special = set(Tokenizer.from_file(str(tiny_tokenizer_path)).get_added_tokens_decoder())
    assert not special & {t for p in a for t in p.token_ids}
    assert len({p.id for p in a}) == 3


def test_random_prompts_need_no_tokenizer():
    prompts = load_prompts(WorkloadSpec(name="random", num_prompts=2, input_len=4), None, vocab_size=50)
    assert all(0 <= t < 50 for p in prompts for t in p.token_ids) and prompts[0].text == ""


def test_jsonl_prompts_are_encoded_exactly_like_the_tokenizer(tiny_tokenizer_path, tmp_path):
    rows = [{"prompt": "def add(a, b):", "category": "code", "id": "q1"}, {"prompt": "The quick brown fox"}]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = load_prompts(WorkloadSpec(name="jsonl", path=str(path)), tiny_tokenizer_path, 384)
    tok = Tokenizer.from_file(str(tiny_tokenizer_path))
    assert [p.token_ids for p in prompts] == [tuple(tok.encode(r["prompt"]).ids) for r in rows]
    assert prompts[0].token_ids[0] == 1, "the post-processor adds <bos>"
    assert (prompts[0].id, prompts[0].category) == ("q1", "code")
    assert (prompts[1].id, prompts[1].category) == ("1", None)
    assert len(load_prompts(WorkloadSpec(name="jsonl", path=str(path), num_prompts=1), tiny_tokenizer_path, 384)) == 1


def test_bad_jsonl_lines_name_the_file_and_line(tiny_tokenizer_path, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: missing field 'prompt' \(a jsonl row needs prompt\)"):
        load_prompts(WorkloadSpec(name="jsonl", path=str(path)), tiny_tokenizer_path, 384)


@pytest.mark.parametrize("content,num_prompts", [("", None), ('{"prompt": "x"}\n', 0)])
def test_empty_workload_is_an_error(tiny_tokenizer_path, tmp_path, content, num_prompts):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match="has no prompts"):
        load_prompts(WorkloadSpec(name="jsonl", path=str(path), num_prompts=num_prompts), tiny_tokenizer_path, 384)


def test_missing_workload_file_is_an_error(tiny_tokenizer_path, tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_prompts(WorkloadSpec(name="jsonl", path=str(tmp_path / "nope.jsonl")), tiny_tokenizer_path, 384)
