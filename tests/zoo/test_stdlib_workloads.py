"""The ``code`` and ``prose`` workloads cut from held-out stdlib files."""

from __future__ import annotations

import platform

import pytest

from specexp.workloads import stdlib
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


@pytest.mark.parametrize("name", ["code", "prose"])
def test_the_first_n_prompts_are_the_head_of_the_whole_round_robin(name):
    """Cutting only the blocks the first n prompts need gives what cutting every file first, then taking the
    first of each, the second of each, ... gives."""
    tokenizer = load_tokenizer()

    def count_tokens(text):
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    per_file = [list(stdlib._file_prompts(name, rel, blocks, 48, count_tokens))
                for rel, blocks in stdlib.frozen_blocks(name)]
    whole = [ps[depth] for depth in range(max(map(len, per_file))) for ps in per_file if depth < len(ps)]
    assert build_prompts(name, 48, None, tokenizer) == whole
    for n in (0, 1, 7, len(per_file) + 3, len(whole), len(whole) + 5):
        assert build_prompts(name, 48, n, tokenizer) == whole[:n]


def test_code_prompts_start_at_a_def_or_class():
    for p in build_prompts("code", input_len=128, num_prompts=64):
        first_code_line = next(line for line in p.text.splitlines() if not line.startswith("@"))
        assert first_code_line.lstrip().startswith(("def ", "async def ", "class ")), p.id


def test_the_shipped_blocks_serve_without_reading_any_stdlib(monkeypatch):
    """Every machine serves the same prompts, whatever its Python (and its stdlib)."""
    expected = build_prompts("code", input_len=96, num_prompts=40)

    def no_stdlib(*args, **kwargs):
        raise AssertionError("the frozen workload read a live stdlib")

    monkeypatch.setattr(stdlib, "split_files", no_stdlib)
    assert build_prompts("code", input_len=96, num_prompts=40) == expected


@pytest.mark.skipif(platform.python_version() != stdlib.frozen_python_version(),
                    reason="the live stdlib is another version than the frozen blocks'")
@pytest.mark.parametrize("name", ["code", "prose"])
@pytest.mark.parametrize("input_len", [16, 128, 512])
def test_frozen_blocks_cut_exactly_as_the_live_stdlib_they_were_frozen_from(name, input_len):
    from specexp.zoo.corpus import stdlib_root

    tokenizer = load_tokenizer()
    assert build_prompts(name, input_len, None, tokenizer) == build_prompts(
        name, input_len, None, tokenizer, stdlib_root=stdlib_root())


def test_freezing_is_deterministic(tmp_path):
    from specexp.workloads.freeze_stdlib import freeze
    from specexp.zoo.corpus import stdlib_root

    freeze(tmp_path / "a.json.gz", stdlib_root())
    freeze(tmp_path / "b.json.gz", stdlib_root())
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    if platform.python_version() == stdlib.frozen_python_version():
        assert (tmp_path / "a.json.gz").read_bytes() == stdlib.FROZEN_BLOCKS.read_bytes()
