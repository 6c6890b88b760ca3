"""Prompt sets: ``random`` (random token ids, the usual latency workload) and ``jsonl`` (one JSON object per
line with a ``prompt`` string, optional ``category`` and ``id``).

``load_prompts(workload, tokenizer_path, vocab_size)`` returns ``list[Prompt]`` tokenized with the
target's tokenizer.json (the random workload also works without one: ids are then drawn from
``range(vocab_size)`` and the prompt text is empty). A workload other than ``random`` with a ``path`` is read as jsonl, so shipped prompt sets
(e.g. ``conf/workload/code.yaml`` with ``path: code.jsonl``) need no code: relative paths are looked up in
the current directory, then in this package's directory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from specexp.errors import ConfigError
from specexp.workloads.jsonl import jsonl_prompts
from specexp.workloads.prompt import Prompt
from specexp.workloads.random_tokens import random_prompts

__all__ = ["LOADERS", "PACKAGE_DIR", "Prompt", "load_prompts", "resolve_workload_path"]

PACKAGE_DIR = Path(__file__).resolve().parent


def resolve_workload_path(path: str) -> Path:
    """``path`` as given if it exists, else the same relative path inside the package directory."""
    given = Path(path).expanduser()
    if given.exists() or given.is_absolute():
        return given
    shipped = PACKAGE_DIR / path
    return shipped if shipped.exists() else given


def _random(workload: Any, tokenizer, vocab_size: int) -> list[Prompt]:
    return random_prompts(tokenizer, vocab_size, workload.num_prompts, workload.input_len, workload.seed)


def _jsonl(workload: Any, tokenizer, vocab_size: int) -> list[Prompt]:
    if tokenizer is None:
        raise ConfigError(f"workload '{workload.name}' needs a tokenizer.json next to the target's config.json")
    if not workload.path:
        raise ConfigError(f"workload '{workload.name}' has no path: set workload.path to a jsonl file")
    return jsonl_prompts(resolve_workload_path(workload.path), tokenizer, workload.num_prompts)


def _stdlib(workload: Any, tokenizer, vocab_size: int) -> list[Prompt]:
    # code / prose: cut from held-out stdlib files at run time (specexp/workloads/stdlib.py)
    from specexp.workloads.stdlib import stdlib_prompts

    if tokenizer is None:
        raise ConfigError(f"workload '{workload.name}' needs a tokenizer.json next to the target's config.json")
    return stdlib_prompts(workload, tokenizer)


# name -> loader(workload, tokenizers.Tokenizer | None, vocab_size) -> list[Prompt].
# Any other name with a path is read as jsonl.
LOADERS: dict[str, Callable[[Any, Any, int], list[Prompt]]] = {
    "random": _random, "jsonl": _jsonl, "code": _stdlib, "prose": _stdlib,
}


def load_prompts(workload: Any, tokenizer_path: str | Path | None, vocab_size: int) -> list[Prompt]:
    """Build the prompts of ``workload`` (a :class:`specexp.specs.WorkloadSpec`) with the tokenizer.json at
    ``tokenizer_path`` (``None``: none available) for a model of ``vocab_size`` tokens. Raises
    :class:`ConfigError` for an unknown or empty workload."""
    from tokenizers import Tokenizer

    loader = LOADERS.get(workload.name)
    if loader is None and not workload.path:
        raise ConfigError(
            f"unknown workload '{workload.name}' without a path: choose one of {', '.join(sorted(LOADERS))}"
            " or set workload.path to a jsonl file"
        )
    tokenizer = Tokenizer.from_file(str(tokenizer_path)) if tokenizer_path else None
    prompts = (loader or _jsonl)(workload, tokenizer, vocab_size)
    if not prompts:
        where = f" ({workload.path})" if workload.path else ""
        raise ConfigError(f"workload '{workload.name}'{where} has no prompts (num_prompts={workload.num_prompts})")
    return prompts
