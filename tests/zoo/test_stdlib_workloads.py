"""The ``code`` and ``prose`` workloads cut from held-out stdlib files."""

from __future__ import annotations

import pytest

from specexp.workloads.stdlib import build_prompts
from specexp.zoo.corpus import is_held_out
from specexp.zoo.tokenizer import load_tokenizer


@pytest.mark.parametrize("name, categories", [("code", {"function", "method", "class"}),
                                               ("prose", {"docstring", "comment"})])
def test_workload_is_deterministic_bounded_and_from_held_out_files(name, categories):
    prompts = build_prompts(name, input_len=64)
    assert prompts == build_prompts(name, input_len=64)
    assert len(prompts) >= 64
    assert len({p.id for p in prompts}) == len(prompts)
    tokenizer = load_tokenizer()
    for p in prompts:
        assert p.category in categories
        assert p.text and p.text == p.text.rstrip()
        assert len(tokenizer.encode(p.text, add_special_tokens=False).ids) <= 64
        rel_path = p.id.split("/", 1)[1].rsplit(":", 1)[0]
        assert is_held_out(rel_path)


def test_a_prefix_of_the_code_workload_spans_many_files():
    prompts = build_prompts("code", input_len=128, num_prompts=32)
    assert len(prompts) == 32
    assert len({p.id.rsplit(":", 1)[0] for p in prompts}) >= 16


def test_code_prompts_start_at_a_def_or_class():
    for p in build_prompts("code", input_len=128, num_prompts=64):
        first_code_line = next(line for line in p.text.splitlines() if not line.startswith("@"))
        assert first_code_line.lstrip().startswith(("def ", "async def ", "class ")), p.id
