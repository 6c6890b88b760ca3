"""The ``code`` and ``prose`` workloads: prompts cut from the held-out files of the stdlib corpus.

- ``code``: the first lines of a held-out function, method or class (categories ``function``,
  ``method``, ``class``), as many whole lines as fit in ``input_len`` tokens, never the whole body.
- ``prose``: the first lines of a docstring (from its opening quotes; category ``docstring``) or of a
  run of at least three comment lines (category ``comment``), likewise.

Each snippet is dedented and stripped of trailing whitespace (so the model continues with the newline
and indentation it would have written itself). Prompts are ordered round-robin over the held-out files
(the first of each file, then the second of each, ...) so any prefix of the list spans many files.

The source blocks are **frozen**: ``data/stdlib_blocks.json.gz`` holds the held-out files' def/class and
docstring/comment blocks as one interpreter's stdlib had them (its ``python`` field; written by
``python -m specexp.workloads.freeze_stdlib``), so every machine — whatever its Python version, whose
stdlib differs — serves the same prompts. Cutting to ``input_len`` tokens happens at load time, with the
target's tokenizer. ``build_prompts(..., stdlib_root=DIR)`` reads a live stdlib instead.
"""

from __future__ import annotations

import ast
import functools
import gzip
import itertools
import json
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specexp.zoo.corpus import SourceFile, split_files

WORKLOADS = ("code", "prose")
MIN_COMMENT_LINES = 3
MIN_DOCSTRING_LINES = 3
FROZEN_BLOCKS = Path(__file__).parent / "data" / "stdlib_blocks.json.gz"
# Lines kept of each block: a prompt is never the whole block, so 101 lines give the live cut exactly for any
# input_len those 100 lines exceed (~1000 tokens).
MAX_BLOCK_LINES = 101


@dataclass(frozen=True)
class SourcePrompt:
    """One prompt's text: ``id`` is ``<name>/<file>:<line>`` (stable across runs on one Python version)."""

    id: str
    category: str
    text: str


def _take_lines(lines: list[str], input_len: int, count_tokens) -> str | None:
    """The longest dedented prefix of ``lines`` (at most ``len(lines) - 1`` lines) within ``input_len`` tokens."""
    best = None
    for n in range(1, len(lines)):
        text = textwrap.dedent("".join(lines[:n])).rstrip()
        if not text:
            continue
        if count_tokens(text) > input_len:
            break
        best = text
    return best


def _code_blocks(tree: ast.AST) -> list[tuple[str, int, int]]:
    """``(category, first_line, last_line)`` (1-based, inclusive) of every def/class, in source order."""
    blocks = []
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                category = "class" if isinstance(child, ast.ClassDef) else (
                    "method" if isinstance(node, ast.ClassDef) else "function")
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                blocks.append((category, first, child.end_lineno))
    return sorted(blocks, key=lambda b: b[1])


def _prose_blocks(tree: ast.AST, lines: list[str]) -> list[tuple[str, int, int]]:
    """``(category, first_line, last_line)`` of docstrings and comment runs, in source order."""
    blocks = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)
                    and first.end_lineno - first.lineno + 1 >= MIN_DOCSTRING_LINES):
                blocks.append(("docstring", first.lineno, first.end_lineno))
    run_start = None
    for i, line in enumerate(lines + [""], start=1):
        if line.lstrip().startswith("#") and not line.startswith("#!"):
            run_start = run_start or i
        else:
            if run_start is not None and i - run_start >= MIN_COMMENT_LINES:
                blocks.append(("comment", run_start, i - 1))
            run_start = None
    return sorted(blocks, key=lambda b: b[1])


def file_blocks(name: str, source: SourceFile) -> list[tuple[int, str, str]]:
    """``(first_line, category, text)`` of each ``name`` block of one source file, in source order; text is
    the block's first :data:`MAX_BLOCK_LINES` lines (line ends kept). [] when the file does not parse."""
    text = source.read_text()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines(keepends=True)
    blocks = _code_blocks(tree) if name == "code" else _prose_blocks(tree, lines)
    return [(first, category, "".join(lines[first - 1 : min(last, first - 1 + MAX_BLOCK_LINES)]))
            for category, first, last in blocks]


def live_blocks(name: str, stdlib_root: Path | None = None) -> list[tuple[str, list[tuple[int, str, str]]]]:
    """``[(file rel_path, file_blocks)]`` of the held-out files of a live stdlib (default: this interpreter's)."""
    return [(f.rel_path, file_blocks(name, f)) for f in split_files(stdlib_root)[1]]


@functools.lru_cache(maxsize=1)
def _frozen() -> dict:
    with gzip.open(FROZEN_BLOCKS, "rt", encoding="utf-8") as f:
        return json.load(f)


def frozen_blocks(name: str) -> list[tuple[str, list[tuple[int, str, str]]]]:
    """The shipped blocks of workload ``name``, shaped as :func:`live_blocks`."""
    return [(rel, [tuple(b) for b in blocks]) for rel, blocks in _frozen()[name]]


def frozen_python_version() -> str:
    """The Python version whose stdlib the shipped blocks come from."""
    return _frozen()["python"]


def _file_prompts(name: str, rel_path: str, blocks, input_len: int, count_tokens) -> Iterator[SourcePrompt]:
    """The file's prompts in source order, cut one at a time as they are asked for."""
    for first, category, text in blocks:
        snippet = _take_lines(text.splitlines(keepends=True), input_len, count_tokens)
        if snippet is not None:
            yield SourcePrompt(f"{name}/{rel_path}:{first}", category, snippet)


def _round_robin(per_file: list[Iterator[SourcePrompt]]) -> Iterator[SourcePrompt]:
    """The first prompt of each file, then the second of each, ...: a file leaves the rotation when it has no
    more. Lazy: a file's next prompt is cut only when the rotation reaches it."""
    live = list(per_file)
    while live:
        still = []
        for prompts in live:
            prompt = next(prompts, None)
            if prompt is not None:
                yield prompt
                still.append(prompts)
        live = still


def build_prompts(name: str, input_len: int = 128, num_prompts: int | None = None,
                  tokenizer=None, stdlib_root: Path | None = None) -> list[SourcePrompt]:
    """The ``name`` workload (``code`` | ``prose``): at most ``num_prompts`` prompts of at most
    ``input_len`` tokens each, counted with ``tokenizer`` (a ``tokenizers.Tokenizer``; default the zoo's)
    without special tokens. Blocks come from the shipped frozen file, or from the live stdlib at
    ``stdlib_root`` when given. Only the blocks the first ``num_prompts`` need are cut (counting a block's
    prefixes is most of the cost: ~0.5 s for the whole ``code`` list on one CPU core)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown stdlib workload {name!r}: expected one of {WORKLOADS}")
    if tokenizer is None:
        from specexp.zoo.tokenizer import load_tokenizer

        tokenizer = load_tokenizer()

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    files = live_blocks(name, stdlib_root) if stdlib_root is not None else frozen_blocks(name)
    ordered = _round_robin([_file_prompts(name, rel, blocks, input_len, count_tokens) for rel, blocks in files])
    return list(itertools.islice(ordered, num_prompts))


DEFAULT_INPUT_LEN = 128


def stdlib_prompts(workload, tokenizer) -> list:
    """The framework's loader for ``workload.name`` in :data:`WORKLOADS`: :class:`specexp.workloads.Prompt`
    records, token ids exactly ``tokenizer.encode(text).ids`` (the target's tokenizer.json)."""
    from specexp.workloads.prompt import Prompt

    input_len = workload.input_len or DEFAULT_INPUT_LEN
    prompts = build_prompts(workload.name, input_len, workload.num_prompts, tokenizer)
    return [Prompt(p.id, p.text, tuple(tokenizer.encode(p.text).ids), p.category) for p in prompts]
