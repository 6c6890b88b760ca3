"""The prompt record every backend consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """One request's prompt.

    ``token_ids``: target-tokenizer ids. Raw text prompts are exactly ``tokenizers.Tokenizer.encode(text).ids``
    (the tokenizer's post-processor alone decides special tokens such as BOS); prompts rendered with a chat
    template are ``encode(text, add_special_tokens=False).ids``, as transformers tokenizes a rendered chat (the
    template writes BOS itself). For the random workload the ids are drawn first and ``text`` is their decoding.

    A prompt is turn ``turn`` (1-based) of a conversation of ``num_turns`` user turns. A later turn's prompt
    holds the model's own earlier answers, so it exists only once those are generated:
    :meth:`follow_up` builds it. ``task``: the benchmark's grouping of categories (Spec-Bench's six tasks), or
    ``None`` when the workload has none.
    """

    id: str
    text: str
    token_ids: tuple[int, ...]
    category: str | None = None
    task: str | None = None
    turn: int = 1
    num_turns: int = 1
    # Builds the next turn's prompt from the answers so far (specexp.workloads.conversation.Conversation).
    conversation: Any = field(default=None, compare=False, repr=False)

    @property
    def request_id(self) -> str:
        """Unique per request: ``id`` for a one-turn prompt, ``<id>/turn<n>`` for a turn of a longer
        conversation."""
        return self.id if self.num_turns == 1 else f"{self.id}/turn{self.turn}"

    def follow_up(self, answers: list[str]) -> Prompt | None:
        """The prompt of turn ``turn + 1`` given the model's answers to turns ``1..turn`` (texts); ``None``
        after the last turn."""
        if self.turn >= self.num_turns or self.conversation is None:
            return None
        return self.conversation.prompt(self.turn + 1, answers)
