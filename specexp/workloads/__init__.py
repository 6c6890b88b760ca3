"""Prompt sets: ``random`` (random token ids, the usual latency workload), ``code``/``prose`` (held-out stdlib
snippets), the benchmarks ``specbench``, ``mtbench``, ``humaneval`` and ``gsm8k``, and ``jsonl`` (any file of
JSON lines, field names in ``workload.prompt_field`` / ``category_field`` / ``id_field``).

``load_prompts(workload, tokenizer_path, vocab_size, model_dir=..., max_prompt_tokens=...)`` returns
``list[Prompt]`` tokenized with the target's tokenizer.json (the random workload also works without one:
ids are then drawn from ``range(vocab_size)`` and the prompt text is empty). For a multi-turn question it
returns turn 1; the backend builds later turns from the model's answers (``Prompt.follow_up``). A workload
other than ``random`` with a ``path`` is read as jsonl. Relative paths are looked up in the current
directory, then in this package's directory. Benchmark files are not shipped: ``workload.path`` points at
the user's copy (see :mod:`specexp.workloads.benchmarks`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from specexp.errors import ConfigError
from specexp.workloads.benchmarks import FORMATS, benchmark_prompts
from specexp.workloads.prompt import Prompt
from specexp.workloads.random_tokens import random_prompts

__all__ = ["LOADERS", "PACKAGE_DIR", "Prompt", "load_prompts", "resolve_workload_path"]

PACKAGE_DIR = Path(__file__).resolve().parent


PROJECT_DIR = PACKAGE_DIR.parents[1]


def resolve_workload_path(path: str) -> Path:
    """``path`` as given if it exists; else the same relative path inside the package directory, then from
    the project's root (a checkout's ``../shared/data/...`` works from any working directory)."""
    given = Path(path).expanduser()
    if given.exists() or given.is_absolute():
        return given
    for base in (PACKAGE_DIR, PROJECT_DIR):
        if (base / path).exists():
            return base / path
    return given


def _random(workload: Any, tokenizer, vocab_size: int, model_dir, max_prompt_tokens) -> list[Prompt]:
    return random_prompts(tokenizer, vocab_size, workload.num_prompts, workload.input_len, workload.seed)


def _needs_tokenizer(workload: Any, tokenizer) -> None:
    if tokenizer is None:
        raise ConfigError(f"workload '{workload.name}' needs a tokenizer.json next to the target's config.json")


def _question_file(workload: Any, tokenizer, vocab_size: int, model_dir, max_prompt_tokens) -> list[Prompt]:
    _needs_tokenizer(workload, tokenizer)
    if not workload.path:
        raise ConfigError(f"workload '{workload.name}' has no path: set workload.path to its question file"
                          " (.jsonl or .jsonl.gz)")
    return benchmark_prompts(workload, resolve_workload_path(workload.path), tokenizer, model_dir, max_prompt_tokens)


def _stdlib(workload: Any, tokenizer, vocab_size: int, model_dir, max_prompt_tokens) -> list[Prompt]:
    # code / prose: cut from held-out stdlib files at run time (specexp/workloads/stdlib.py)
    from specexp.workloads.stdlib import stdlib_prompts

    _needs_tokenizer(workload, tokenizer)
    return stdlib_prompts(workload, tokenizer)


# name -> loader(workload, tokenizers.Tokenizer | None, vocab_size, model_dir, max_prompt_tokens) -> list[Prompt].
# Any other name with a path is read as jsonl.
LOADERS: dict[str, Callable[..., list[Prompt]]] = {
    "random": _random, "jsonl": _question_file, "code": _stdlib, "prose": _stdlib,
    **{name: _question_file for name in FORMATS},
}


def load_prompts(workload: Any, tokenizer_path: str | Path | None, vocab_size: int,
                 model_dir: str | Path | None = None, max_prompt_tokens: int | None = None) -> list[Prompt]:
    """Build the prompts of ``workload`` (a :class:`specexp.specs.WorkloadSpec`) with the tokenizer.json at
    ``tokenizer_path`` (``None``: none available) for a model of ``vocab_size`` tokens. ``model_dir``: the
    target's directory, where ``workload.chat_template=auto`` finds its template (default: the tokenizer's
    directory); ``max_prompt_tokens``: file prompts longer than this are left out. Raises
    :class:`ConfigError` for an unknown or empty workload."""
    from tokenizers import Tokenizer

    loader = LOADERS.get(workload.name)
    if loader is None and not workload.path:
        raise ConfigError(
            f"unknown workload '{workload.name}' without a path: choose one of {', '.join(sorted(LOADERS))}"
            " or set workload.path to a jsonl file"
        )
    tokenizer = Tokenizer.from_file(str(tokenizer_path)) if tokenizer_path else None
    if model_dir is None and tokenizer_path:
        model_dir = Path(tokenizer_path).parent
    prompts = (loader or _question_file)(workload, tokenizer, vocab_size, model_dir, max_prompt_tokens)
    if not prompts:
        where = f" ({workload.path})" if workload.path else ""
        raise ConfigError(f"workload '{workload.name}'{where} has no prompts (num_prompts={workload.num_prompts})")
    return prompts
