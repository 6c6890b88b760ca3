"""Replay greedy speculation offline from a run's outputs, under each backend's end-of-request rule.

Why: backends count acceptance differently at the edges of a request, so the same pair, prompts and outputs
give different acceptance lengths on native, vLLM and hf. With greedy sampling, which drafts a backend
verifies and how many tokens it accepts is fixed by two things only: the output tokens, and the draft's
greedy next token after each prefix of them. So one forward of the draft over `prompt + output` (plus the
target's greedy continuation past the output, for backends that verify past the end) predicts every
backend's counters. When the prediction equals a backend's measured counters exactly, its acceptance gap to
another backend is accounting, not a model or kernel difference; where it does not, the backends drafted or
verified differently (a near-tie resolved another way, a bug).

Rules (token 0 of the output is the one the target samples after the prompt):

- ``native`` (specexp's engine, docs/design.md §4): token 0 comes from the prefill, undrafted. Each later step
  drafts ``min(k, L - n - 1)`` tokens, n = tokens produced so far, L = output length: it never drafts a
  token the request cannot keep, and a step with nothing left to draft is a plain decode step (no draft).
- ``vllm`` (vLLM 0.26 draft_model): token 0 from the prefill; every later step verifies a full k-token
  draft, and tokens accepted past the end of the request (max_tokens) are counted, then dropped.
- ``hf`` (transformers assisted generation): no separate prefill sample — token 0 is speculated too; the
  drafts are trimmed like native's.

All three emit ``accepted + 1`` tokens per verified draft. Requests that stopped at EOS are replayed the
same way, as if their last token were the length limit.

    counts = replay_request(matches, num_output_tokens=L, k=4, rule="vllm")

``matches[i]`` says whether the draft's greedy next token after the prompt and output tokens ``0..i-1``
equals output token ``i``; it must cover ``i < L + k`` (past the output: the target's greedy continuation),
see :func:`draft_matches`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

RULES = ("native", "vllm", "hf")


@dataclass(frozen=True)
class AccountingRule:
    """How a backend drafts at the edges of a request.

    first_drafted_token: the first output token a draft can propose (1: the prefill samples token 0).
    trim_to_request: drafts never propose tokens past the request's last (False: always k, counted anyway).
    """

    first_drafted_token: int
    trim_to_request: bool


ACCOUNTING_RULES = {
    "native": AccountingRule(first_drafted_token=1, trim_to_request=True),
    "vllm": AccountingRule(first_drafted_token=1, trim_to_request=False),
    "hf": AccountingRule(first_drafted_token=0, trim_to_request=True),
}


@dataclass
class DraftCounts:
    """Draft counters of docs/design.md §4 at depth k: ``num_drafts`` (verified drafts), ``num_draft_tokens``
    (tokens they proposed), ``accepted_per_position[i]`` (drafts whose token i was accepted; length k)."""

    k: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.k

    @property
    def num_accepted_tokens(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def acceptance_length(self) -> float:
        """1 + accepted tokens per draft (1.0 without drafts), as docs/design.md §4 defines it."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


@dataclass
class ReplayCounts(DraftCounts):
    """Counters of docs/design.md §4 for one request or summed over a run (:class:`DraftCounts`, and
    num_counted_tokens: tokens the backend's counters account for (undrafted tokens + drafts + accepted) — the
    output length, or more where accepted tokens past the end are counted)."""

    num_counted_tokens: int = 0

    def __add__(self, other: ReplayCounts) -> ReplayCounts:
        if other.k != self.k:
            raise ValueError(f"cannot add counts of k={self.k} and k={other.k}")
        return ReplayCounts(
            self.k, self.num_drafts + other.num_drafts, self.num_draft_tokens + other.num_draft_tokens,
            [a + b for a, b in zip(self.accepted_per_position, other.accepted_per_position, strict=True)],
            self.num_counted_tokens + other.num_counted_tokens,
        )


def replay_request(matches: Sequence[bool], num_output_tokens: int, k: int, rule: str) -> ReplayCounts:
    """Counters one request gets under `rule` (see the module doc).

    matches: bool per output position i (draft's greedy token after tokens 0..i-1 == token i), length at
    least num_output_tokens + k when the rule verifies past the end, else num_output_tokens.
    num_output_tokens: L >= 1; k: draft length >= 1; rule: one of RULES.
    """
    if rule not in ACCOUNTING_RULES:
        raise ValueError(f"rule {rule!r} is not one of {', '.join(RULES)}")
    if k < 1:
        raise ValueError(f"k must be >= 1 to replay speculation, got {k}")
    if num_output_tokens < 1:
        raise ValueError(f"num_output_tokens must be >= 1, got {num_output_tokens}")
    acc = ACCOUNTING_RULES[rule]
    needed = num_output_tokens if acc.trim_to_request else num_output_tokens + k
    if len(matches) < needed:
        raise ValueError(f"rule {rule!r} needs matches for {needed} positions (output {num_output_tokens} + "
                         f"k {k} past it), got {len(matches)}")
    counts = ReplayCounts(k)
    produced = 0 if acc.first_drafted_token == 0 else 1  # the prefill samples token 0 undrafted
    counts.num_counted_tokens = produced
    while produced < num_output_tokens:
        budget = k if not acc.trim_to_request else min(k, num_output_tokens - produced - 1)
        if budget <= 0:  # nothing left worth drafting: a plain decode step
            produced += 1
            counts.num_counted_tokens += 1
            continue
        accepted = 0
        while accepted < budget and matches[produced + accepted]:
            counts.accepted_per_position[accepted] += 1
            accepted += 1
        counts.num_drafts += 1
        counts.num_draft_tokens += budget
        counts.num_counted_tokens += accepted + 1
        produced += accepted + 1
    return counts


def draft_matches(target, draft, prompt_ids: Sequence[int], output_ids: Sequence[int], extra_tokens: int
                  ) -> list[bool]:
    """matches[i] for i < len(output_ids) + extra_tokens (see the module doc), from one greedy continuation
    of the target (extra_tokens past the output) and one forward of the draft over the whole sequence.

    target/draft: causal LMs called as ``model(input_ids).logits`` ([1, S] int64 -> [1, S, vocab]) with a
    greedy ``generate``, e.g. transformers models (see :func:`load_pair`). The draft's full-sequence argmax
    stands for its token-by-token greedy drafts: equal up to floating-point near-ties.
    """
    import torch

    if not prompt_ids or not output_ids:
        raise ValueError("a replay needs a non-empty prompt and output")
    device = next(draft.parameters()).device
    sequence = torch.tensor([list(prompt_ids) + list(output_ids)], dtype=torch.int64, device=device)
    with torch.no_grad():
        if extra_tokens > 0:
            sequence = target.generate(sequence, attention_mask=torch.ones_like(sequence), do_sample=False,
                                       max_new_tokens=extra_tokens, min_new_tokens=extra_tokens)
        predicted = draft(sequence).logits[0].argmax(-1)  # predicted[j]: the draft's token after 0..j
    num_prompt = len(prompt_ids)
    targets = sequence[0, num_prompt:]
    return (predicted[num_prompt - 1: num_prompt - 1 + targets.shape[0]] == targets).tolist()


def load_pair(target_path: str | Path, draft_path: str | Path):
    """(target, draft) as transformers models in float32 on the CPU, from checkpoint directories or zoo
    names (:func:`specexp.pairs.resolve_model_dir`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from specexp.pairs import resolve_model_dir

    models = []
    for path in (target_path, draft_path):
        directory = resolve_model_dir(str(path))
        if not any(directory.glob("*.safetensors")):
            raise ValueError(f"{directory} has no weights (a config-only model): replay needs the checkpoint the "
                             "runs used")
        models.append(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval())
    return models[0], models[1]


def replay_run(target, draft, prompts: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]], k: int,
               rules: Sequence[str] = RULES) -> dict[str, ReplayCounts]:
    """Summed counters of every request (prompt id -> prompt / output token ids) under each rule."""
    missing = sorted(set(outputs) - set(prompts))
    if missing:
        raise ValueError(f"outputs without prompts: {missing[:5]}")
    totals = {rule: ReplayCounts(k) for rule in rules}
    for request_id, output in outputs.items():
        matches = draft_matches(target, draft, prompts[request_id], output, extra_tokens=k)
        for rule in rules:
            totals[rule] = totals[rule] + replay_request(matches, len(output), k, rule)
    return totals
