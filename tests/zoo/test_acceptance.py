"""The greedy acceptance-length simulation equals step-by-step greedy speculative decoding."""

from __future__ import annotations

import pytest
import torch

from specexp.zoo.acceptance import (
    acceptance_lengths,
    greedy_continuation,
    match_lengths,
    walk_acceptance,
)
from specexp.zoo.architectures import build_model

SIZE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 256}
CPU = torch.device("cpu")


def test_match_lengths_count_consecutive_agreement_capped_at_max_k():
    agree = [True, True, False, True, True, True, True, False]
    assert match_lengths(agree, max_k=8) == [2, 1, 0, 4, 3, 2, 1, 0]
    assert match_lengths(agree, max_k=3) == [2, 1, 0, 3, 3, 2, 1, 0]


def test_walk_emits_accepted_plus_one_per_verify_step():
    match = [2, 1, 0, 4, 3, 2, 1, 0, 0, 0]
    # k=2: p=0 accept 2 -> p=3 accept 2 -> p=6 accept 1 -> p=8 accept 0 -> p=9 accept 0 -> p=10
    assert walk_acceptance(match, new_tokens=10, k=2) == (5, 5)


def _stepwise_acceptance_length(target, draft, prompts, new_tokens, k):
    """Greedy speculative decoding as an engine does it, pooled over prompts: the draft proposes k tokens
    from the verified context, the target's greedy choices verify them in one forward, and the step
    emits the accepted prefix plus one target token."""
    drafts = accepted = 0
    for prompt in prompts:
        context = list(prompt)
        while len(context) - len(prompt) < new_tokens:
            proposal = greedy_continuation(draft, context, k, CPU)
            with torch.no_grad():
                logits = target(input_ids=torch.tensor([context + proposal])).logits[0, len(context) - 1 :]
            choice = logits.argmax(-1).tolist()
            a = 0
            while a < k and proposal[a] == choice[a]:
                a += 1
            context += proposal[:a] + [choice[a]]
            drafts, accepted = drafts + 1, accepted + a
    return 1 + accepted / drafts


def _random_pair(arch: str):
    """A random target and a draft equal to it up to 5% weight noise: they agree often, not always.
    (Weights are scaled up from HF's init so the greedy output depends on the context.)"""
    size = dict(SIZE, **({"layer_types": ["conv", "full_attention"]} if arch == "lfm2" else {}))
    target, draft = build_model(arch, size, seed=0).eval(), build_model(arch, size, seed=0).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for pt, pd in zip(target.parameters(), draft.parameters()):
            if pt.dim() >= 2:
                weight = 0.3 * torch.randn(pt.shape, generator=generator)
                pt.copy_(weight)
                pd.copy_(weight + 0.05 * 0.3 * torch.randn(pt.shape, generator=generator))
    return target, draft


@pytest.mark.parametrize("arch", ["llama", "lfm2"])
def test_simulation_equals_stepwise_greedy_speculation(arch):
    target, draft = _random_pair(arch)
    prompts = [[1, 50, 60, 70, 80], [1, 7, 8, 9]]
    stats = acceptance_lengths(target, draft, prompts, new_tokens=24, ks=[1, 2, 4], device=CPU)
    for k, s in stats.items():
        assert s.acceptance_length == pytest.approx(_stepwise_acceptance_length(target, draft, prompts, 24, k))
    assert 1.2 < stats[4].acceptance_length < 4.5, "the pair should agree sometimes, not always"


def test_draft_identical_to_target_accepts_everything():
    target = build_model("llama", SIZE, seed=1).eval()
    stats = acceptance_lengths(target, target, [[1, 5, 6, 7]], new_tokens=20, ks=[1, 3, 4], device=CPU)
    assert [stats[k].num_accepted_tokens / stats[k].num_drafts for k in (1, 3, 4)] == [1, 3, 4]
