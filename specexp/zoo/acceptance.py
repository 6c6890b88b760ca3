"""Exact greedy acceptance lengths of a draft against a target, simulated with HF models.

Greedy speculative decoding emits exactly the target's greedy continuation ``T``. At a verify step
whose verified context ends at position ``p`` of ``T``, the draft greedily proposes ``k`` tokens from
``prompt + T[:p]``; the accepted count is the length of the prefix that matches ``T[p:p+k]``, and the step
emits ``accepted + 1`` tokens (the correction or bonus token included), so the next step starts at
``p + accepted + 1``. The acceptance length is the mean number emitted per verify step
(``1 + num_accepted_tokens / num_drafts``, docs/design.md §4), over all steps of all prompts.

While the draft's proposals match, its context *is* ``prompt + T[:p + j]``. So its ``j``-th proposal
from ``p`` equals its greedy prediction at position ``p + j`` of one teacher-forced pass over
``prompt + T``, and ``match[p]`` (the matching-prefix length, capped at ``max_k``) is the run of
consecutive agreements ``draft_argmax[q] == T[q]`` starting at ``q = p``. One target generation and one
draft forward per prompt give the acceptance length for every ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class AcceptanceStats:
    """Counts over all prompts for one depth ``k`` (names as in docs/design.md §4)."""

    k: int
    num_drafts: int = 0
    num_accepted_tokens: int = 0

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts


@torch.no_grad()
def greedy_continuation(model, prompt_ids: Sequence[int], new_tokens: int, device: torch.device) -> list[int]:
    """The ``new_tokens`` greedy tokens ``model`` appends to ``prompt_ids`` (EOS ignored; KV cache used)."""
    ids = torch.tensor([list(prompt_ids)], device=device)
    out = model(input_ids=ids, use_cache=True)
    tokens = []
    for i in range(new_tokens):
        next_id = out.logits[:, -1].argmax(-1)
        tokens.append(int(next_id))
        if i + 1 < new_tokens:
            out = model(input_ids=next_id[:, None], past_key_values=out.past_key_values, use_cache=True)
    return tokens


@torch.no_grad()
def greedy_continuations_batched(model, prompts_ids: Sequence[Sequence[int]], new_tokens: int,
                                 device: torch.device, pad_id: int = 0) -> list[list[int]]:
    """Like :func:`greedy_continuation` for many prompts at once, recomputing the whole right-padded batch
    each step (no cache). Fast on a GPU, where these models are launch-bound; slow on a CPU."""
    lengths = torch.tensor([len(p) for p in prompts_ids], device=device)
    buffer = torch.full((len(prompts_ids), int(lengths.max()) + new_tokens), pad_id, device=device)
    for i, prompt in enumerate(prompts_ids):
        buffer[i, : len(prompt)] = torch.tensor(list(prompt), device=device)
    rows = torch.arange(len(prompts_ids), device=device)
    for _ in range(new_tokens):
        hidden = model.model(input_ids=buffer[:, : int(lengths.max())], use_cache=False).last_hidden_state
        next_ids = model.lm_head(hidden[rows, lengths - 1]).argmax(-1)
        buffer[rows, lengths] = next_ids
        lengths += 1
    return [buffer[i, len(p) : len(p) + new_tokens].tolist() for i, p in enumerate(prompts_ids)]


@torch.no_grad()
def draft_agreement(draft, prompt_ids: Sequence[int], continuation: Sequence[int],
                    device: torch.device) -> list[bool]:
    """``agree[q]``: the draft's greedy token after ``prompt + continuation[:q]`` is ``continuation[q]``."""
    full = torch.tensor([list(prompt_ids) + list(continuation)], device=device)
    logits = draft(input_ids=full, use_cache=False).logits[0]
    start = len(prompt_ids) - 1
    predicted = logits[start : start + len(continuation)].argmax(-1)
    return (predicted == full[0, len(prompt_ids):]).tolist()


def match_lengths(agree: Sequence[bool], max_k: int) -> list[int]:
    """``match[p]``: consecutive ``True`` in ``agree`` from ``p``, capped at ``max_k`` (one per position)."""
    match = [0] * (len(agree) + 1)
    for q in range(len(agree) - 1, -1, -1):
        match[q] = min(match[q + 1] + 1, max_k) if agree[q] else 0
    return match[: len(agree)]


def walk_acceptance(match: Sequence[int], new_tokens: int, k: int) -> tuple[int, int]:
    """``(num_drafts, num_accepted_tokens)`` of greedy speculation at depth ``k`` until ``new_tokens``
    tokens are emitted. ``match`` must cover positions ``0 .. new_tokens - 1``."""
    position, drafts, accepted = 0, 0, 0
    while position < new_tokens:
        a = min(match[position], k)
        drafts += 1
        accepted += a
        position += a + 1
    return drafts, accepted


def acceptance_lengths(target, draft, prompts_ids: Sequence[Sequence[int]], new_tokens: int,
                       ks: Sequence[int], device: torch.device,
                       continuations: Sequence[Sequence[int]] | None = None) -> dict[int, AcceptanceStats]:
    """Greedy acceptance stats at each depth in ``ks`` over ``prompts_ids`` (token ids, BOS included),
    generating ``new_tokens + max(ks)`` target tokens per prompt (or reusing the target's ``continuations``,
    which must be at least that long)."""
    max_k = max(ks)
    stats = {k: AcceptanceStats(k) for k in ks}
    for i, prompt_ids in enumerate(prompts_ids):
        if continuations is None:
            continuation = greedy_continuation(target, prompt_ids, new_tokens + max_k, device)
        else:
            continuation = list(continuations[i])[: new_tokens + max_k]
        if len(continuation) < new_tokens + max_k:
            raise ValueError(f"continuation has {len(continuation)} tokens, need new_tokens + max_k = "
                             f"{new_tokens + max_k}")
        match = match_lengths(draft_agreement(draft, prompt_ids, continuation, device), max_k)
        for k in ks:
            drafts, accepted = walk_acceptance(match, new_tokens, k)
            stats[k].num_drafts += drafts
            stats[k].num_accepted_tokens += accepted
    return stats
