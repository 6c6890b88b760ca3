"""The prompt record every backend consumes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One request's prompt.

    ``token_ids``: target-tokenizer ids, exactly ``tokenizers.Tokenizer.encode(text).ids`` for text prompts
    (the tokenizer's post-processor alone decides special tokens such as BOS); for the random workload the
    ids are drawn first and ``text`` is their decoding.
    """

    id: str
    text: str
    token_ids: tuple[int, ...]
    category: str | None = None
