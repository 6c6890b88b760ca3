"""Conversations: a question's user turns, and how each turn becomes a prompt.

Turn ``n``'s prompt is the conversation so far — the system prompt (if any), user turns ``1..n`` and the
model's own answers to turns ``1..n-1`` — rendered with the chat template and an open assistant turn
(``add_generation_prompt=True``), as Spec-Bench and FastChat build MT-Bench's second turn. An answer is the
generated text decoded without special tokens and stripped of surrounding whitespace (:func:`answer_text`).

Without a chat template the prompt is raw text: the system prompt, then the user turns and answers so far,
joined by blank lines, encoded with the tokenizer's post-processor (``encode(text).ids``).
"""

from __future__ import annotations

from dataclasses import dataclass

from specexp.workloads.chat_template import ChatTemplate
from specexp.workloads.prompt import Prompt

RAW_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class PromptFormat:
    """How messages become a prompt: ``tokenizer`` (a ``tokenizers.Tokenizer``), the chat ``template`` (``None``:
    raw text) and the ``system_prompt`` (``None``: none)."""

    tokenizer: object
    template: ChatTemplate | None = None
    system_prompt: str | None = None

    def messages(self, user_turns: tuple[str, ...], answers: list[str]) -> list[dict]:
        """``[{"role", "content"}, ...]``: system prompt, then user turn / answer pairs, ending with the user
        turn ``len(answers) + 1``."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for i, user in enumerate(user_turns[: len(answers) + 1]):
            messages.append({"role": "user", "content": user})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        return messages

    def encode(self, messages: list[dict]) -> tuple[str, tuple[int, ...]]:
        """``(text, token ids)`` of the prompt that asks for the next assistant turn after ``messages``."""
        if self.template is not None:
            return self.template.encode(self.tokenizer, messages, add_generation_prompt=True)
        text = RAW_SEPARATOR.join(m["content"] for m in messages)
        return text, tuple(self.tokenizer.encode(text).ids)


@dataclass(frozen=True)
class Conversation:
    """One question of a benchmark: ``user_turns`` (one or more), its ``category`` and ``task``."""

    id: str
    user_turns: tuple[str, ...]
    category: str | None
    task: str | None
    format: PromptFormat

    def prompt(self, turn: int, answers: list[str]) -> Prompt:
        """Turn ``turn``'s prompt (1-based) given the answers to the turns before it."""
        if not 1 <= turn <= len(self.user_turns):
            raise ValueError(f"conversation {self.id} has {len(self.user_turns)} turns, not a turn {turn}")
        if len(answers) < turn - 1:
            raise ValueError(f"turn {turn} of conversation {self.id} needs {turn - 1} answers, got {len(answers)}")
        text, ids = self.format.encode(self.format.messages(self.user_turns, list(answers[: turn - 1])))
        return Prompt(id=self.id, text=text, token_ids=ids, category=self.category, task=self.task, turn=turn,
                      num_turns=len(self.user_turns), conversation=self)


def answer_text(tokenizer, output_token_ids: list[int]) -> str:
    """The model's answer as the next turn quotes it: decoded without special tokens (so EOS goes), stripped."""
    return tokenizer.decode(list(output_token_ids), skip_special_tokens=True).strip()
