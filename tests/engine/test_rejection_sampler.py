"""Rejection sampling: greedy acceptance rule, distribution preservation (chi-square), synthetic mode."""

import pytest
import torch
from scipy.stats import chisquare

from specexp.engine.rejection_sampler import RejectionSampler


def _greedy_case():
    # Target argmax per column: [3, 1, 4, 1, 5]
    vocab = 8
    target_tokens = torch.tensor([[3, 1, 4, 1, 5]])
    logits = torch.full((1, 5, vocab), -5.0)
    logits.scatter_(2, target_tokens.unsqueeze(2), 5.0)
    return logits


@pytest.mark.parametrize(
    "drafts, num_drafts, expected",
    [
        ([3, 1, 4, 1], 4, [3, 1, 4, 1, 5]),  # all accepted + bonus
        ([3, 1, 0, 1], 4, [3, 1, 4, -1, -1]),  # first mismatch at 2 -> correction 4
        ([0, 1, 4, 1], 4, [3, -1, -1, -1, -1]),  # nothing accepted
        ([3, 1, 4, 1], 2, [3, 1, 4, -1, -1]),  # only 2 drafts scheduled: bonus from column 2
        ([3, 1, 4, 1], 0, [3, -1, -1, -1, -1]),  # a prefill row: one sampled token
    ],
)
def test_greedy_accepts_while_draft_equals_target_argmax(drafts, num_drafts, expected):
    sampler = RejectionSampler(temperature=0.0, top_k=0, top_p=1.0)
    out = sampler(_greedy_case(), torch.tensor([drafts]), torch.tensor([num_drafts]), None, torch.tensor([True]))
    assert out.sampled[0].tolist() == expected
    assert out.num_sampled.tolist() == [sum(t >= 0 for t in expected)]


def test_rows_that_do_not_sample_emit_nothing():
    sampler = RejectionSampler(temperature=0.0, top_k=0, top_p=1.0)
    out = sampler(_greedy_case(), torch.tensor([[3, 1, 4, 1]]), torch.tensor([4]), None, torch.tensor([False]))
    assert out.num_sampled.tolist() == [0]
    assert out.sampled.tolist() == [[-1] * 5]


@pytest.mark.parametrize("k", [1, 4])
def test_first_emitted_token_follows_the_target_distribution(k):
    """Leviathan/Chen: whatever the draft distribution q, emitted tokens are distributed as p."""
    torch.manual_seed(0)
    vocab, trials = 6, 60_000
    target_logits = torch.randn(1, k + 1, vocab).expand(trials, -1, -1).contiguous()
    draft_probs = torch.softmax(torch.randn(1, k, vocab) * 1.5, dim=-1).expand(trials, -1, -1).contiguous()
    gen = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).view(trials, k)
    sampler = RejectionSampler(temperature=1.0, top_k=0, top_p=1.0, generator=gen)
    out = sampler(target_logits, drafts, torch.full((trials,), k), draft_probs, torch.ones(trials, dtype=torch.bool))
    first = out.sampled[:, 0]
    counts = torch.bincount(first, minlength=vocab).double()
    expected = torch.softmax(target_logits[0, 0].double(), -1) * counts.sum()
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 0.01
    # The drafts really were rejected sometimes and accepted sometimes.
    assert 0 < (out.num_sampled > 1).float().mean() < 1


def test_second_token_given_acceptance_follows_the_target():
    """Conditioned on the first draft being accepted, the second emitted token is ~ p[1]."""
    torch.manual_seed(2)
    vocab, trials, k = 4, 80_000, 2
    target_logits = torch.randn(1, k + 1, vocab).expand(trials, -1, -1).contiguous()
    draft_probs = torch.softmax(torch.randn(1, k, vocab), dim=-1).expand(trials, -1, -1).contiguous()
    gen = torch.Generator().manual_seed(3)
    drafts = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).view(trials, k)
    sampler = RejectionSampler(temperature=1.0, top_k=0, top_p=1.0, generator=gen)
    out = sampler(target_logits, drafts, torch.full((trials,), k), draft_probs, torch.ones(trials, dtype=torch.bool))
    # Column 1 is the target's second token in every row that kept >= 2 tokens. Since the target at column 1
    # does not depend on token 0 here, its marginal over those rows must be p[1].
    keep = out.num_sampled >= 2
    counts = torch.bincount(out.sampled[keep, 1], minlength=vocab).double()
    expected = torch.softmax(target_logits[0, 1].double(), -1) * counts.sum()
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 0.01


def test_top_k_restricts_the_target_distribution():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[[3.0, 2.0, 1.0, 0.0]]]).expand(5000, -1, -1)
    sampler = RejectionSampler(temperature=1.0, top_k=2, top_p=1.0, generator=gen)
    out = sampler(logits, torch.zeros(5000, 0, dtype=torch.int64), torch.zeros(5000, dtype=torch.int64),
                  torch.zeros(5000, 0, 4), torch.ones(5000, dtype=torch.bool))
    assert set(out.sampled[:, 0].tolist()) <= {0, 1}


@pytest.mark.parametrize("rate", [0.0, 0.6, 1.0])
def test_synthetic_mode_accepts_with_the_given_rate(rate):
    gen = torch.Generator().manual_seed(0)
    trials, k, vocab = 20_000, 3, 5
    logits = torch.randn(trials, k + 1, vocab)
    drafts = torch.randint(vocab, (trials, k))
    sampler = RejectionSampler(temperature=0.0, top_k=0, top_p=1.0, mode="synthetic",
                               synthetic_acceptance_rate=rate, generator=gen)
    out = sampler(logits, drafts, torch.full((trials,), k), None, torch.ones(trials, dtype=torch.bool))
    accepted = (out.num_sampled - 1).double()
    expected = sum(rate ** (i + 1) for i in range(k))  # E[accepted prefix] = sum_i rate^i
    assert abs(accepted.mean().item() - expected) < 0.05


@pytest.mark.parametrize(("rates", "length"), [([0.9, 0.6, 0.6, 0.2], None), (None, 2.7), (None, 5.0), (None, 1.0)])
def test_synthetic_mode_imposes_vllms_per_position_rates_and_lengths(rates, length):
    """Position i is accepted (with all before it) with the unconditional rate r_i; a length L spreads as
    vLLM's minimum-variance schedule, so the mean acceptance length is L."""
    from specexp.engine.config import SpeculatorConfig

    gen = torch.Generator().manual_seed(1)
    trials, k, vocab = 20_000, 4, 5
    spec = SpeculatorConfig(num_speculative_tokens=k, rejection="synthetic", synthetic_acceptance_rates=rates,
                            synthetic_acceptance_length=length)
    spec.validate(max_model_len=64)
    sampler = RejectionSampler(temperature=0.0, top_k=0, top_p=1.0, mode="synthetic",
                               synthetic_conditional_rates=spec.synthetic_conditional_rates(), generator=gen)
    out = sampler(torch.randn(trials, k + 1, vocab), torch.randint(vocab, (trials, k)), torch.full((trials,), k),
                  None, torch.ones(trials, dtype=torch.bool))
    accepted = out.num_sampled - 1
    unconditional = spec.synthetic_rates()
    for i, r in enumerate(unconditional):
        assert abs((accepted > i).double().mean().item() - r) < 0.015
    if length is not None:
        assert 1 + sum(unconditional) == pytest.approx(length)
        assert abs(1 + accepted.double().mean().item() - length) < 0.03
