"""Verification of draft tokens against the target (Leviathan et al. 2023; Chen et al. 2023).

For each row, the target scored q = 1 + num_drafts tokens: its logits at column i predict the token after
query token i. Drafts are accepted left to right; the first rejection ends the row with a *correction*
token, and a row whose drafts are all accepted gets a *bonus* token from the target's last column.

- greedy:     accept while draft == target argmax; emit the argmax at the first mismatch.
- standard:   accept draft d with probability min(1, p(d) / q(d)); on rejection sample from
              norm(max(0, p - q)). The emitted tokens are distributed exactly as target-only sampling.
- synthetic:  accept draft i with probability `rates[i]` given drafts 0..i-1 were, whatever the tokens (a
              system-cost model, not lossless: `specexp.engine.synthetic`); the token after the accepted
              prefix comes from the target as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specexp.engine.sampling import Argmax, RandomSource, logits_to_probs, sample_from_probs, torch_argmax, uniform


@dataclass
class VerifyOutput:
    """sampled: int64[R, K+1], the row's emitted tokens left-aligned, -1 after them.
    num_sampled: int64[R], accepted drafts + 1 (0 for rows that do not sample this step)."""

    sampled: torch.Tensor
    num_sampled: torch.Tensor


def _accepted_prefix_len(accept: torch.Tensor) -> torch.Tensor:
    """accept: bool[R, K] -> int64[R], length of the leading run of True."""
    if accept.shape[1] == 0:
        return torch.zeros(accept.shape[0], dtype=torch.int64, device=accept.device)
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _emit(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, last_token: torch.Tensor,
          samples: torch.Tensor) -> VerifyOutput:
    """sampled[r] = drafts[:a] ++ [last_token] ++ -1..., a = num_accepted[r]."""
    num_rows, k = draft_tokens.shape
    cols = torch.arange(k + 1, device=draft_tokens.device)
    padded_drafts = torch.cat([draft_tokens, draft_tokens.new_zeros(num_rows, 1)], dim=1)
    a = num_accepted.unsqueeze(1)
    sampled = torch.where(cols < a, padded_drafts, torch.where(cols == a, last_token.unsqueeze(1), -1))
    sampled = torch.where(samples.unsqueeze(1), sampled, -1)
    num_sampled = torch.where(samples, num_accepted + 1, 0)
    return VerifyOutput(sampled, num_sampled)


class RejectionSampler:
    """Turns target logits + drafts into emitted tokens, on the device, with no host sync.

    temperature/top_k/top_p: the run's sampling settings. mode: "standard" | "synthetic".
    synthetic: synthetic_acceptance_rate, every position's acceptance given the ones before; or
    synthetic_conditional_rates float[K], one per draft position (`SpeculatorConfig.synthetic_conditional_rates`).
    """

    def __init__(self, *, temperature: float, top_k: int, top_p: float, mode: str = "standard",
                 synthetic_acceptance_rate: float = 1.0, synthetic_conditional_rates: list[float] | None = None,
                 generator: RandomSource = None, argmax: Argmax = torch_argmax) -> None:
        self.temperature = temperature
        self.argmax = argmax  # over the vocabulary (`sampling.ARGMAX_KERNELS`)
        self.top_k = top_k
        self.top_p = top_p
        self.mode = mode
        self.rate = synthetic_acceptance_rate
        self.conditional_rates = synthetic_conditional_rates
        self._rates_tensor: torch.Tensor | None = None
        self.generator = generator

    def set_conditional_rates(self, rates: list[float]) -> None:
        """Replace the synthetic per-position conditional acceptance (float[K], each in [0, 1]) in place: graphs
        captured with the old rates read the new ones, since they hold the rates' device tensor."""
        if self.conditional_rates is not None and len(rates) != len(self.conditional_rates):
            raise ValueError(f"{len(rates)} synthetic rates for {len(self.conditional_rates)} draft positions")
        self.conditional_rates = [float(r) for r in rates]
        if self._rates_tensor is not None:
            with torch.inference_mode():  # made inside the engine's inference mode
                self._rates_tensor.copy_(torch.tensor(self.conditional_rates, dtype=torch.float32))

    def synthetic_draws(self, num_rows: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | float]:
        """Synthetic acceptance's draws for a step: (u fp32[num_rows, k] uniform from the generator, the rates u is
        compared with: fp32[k] per position, or the scalar rate); draft j of a row passes when u[j] < rate j."""
        u = uniform((num_rows, k), device, self.generator)
        return u, self._synthetic_rates(k, device)

    def _synthetic_rates(self, k: int, device: torch.device) -> torch.Tensor | float:
        """Per-position conditional acceptance, fp32[k] on `device` (made once), or the scalar rate."""
        if self.conditional_rates is None:
            return self.rate
        if self._rates_tensor is None or self._rates_tensor.device != device:
            self._rates_tensor = torch.tensor(self.conditional_rates, dtype=torch.float32, device=device)
        return self._rates_tensor[:k]

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        samples: torch.Tensor,
    ) -> VerifyOutput:
        """target_logits: fp32[R, K+1, V]; draft_tokens: int64[R, K]; num_draft_tokens: int64[R] (<= K);
        draft_probs: fp32[R, K, V] (the distribution each draft was sampled from; None when greedy);
        samples: bool[R] (rows that emit tokens this step)."""
        num_rows, k = draft_tokens.shape
        cols = torch.arange(k, device=draft_tokens.device)
        is_draft = cols.unsqueeze(0) < num_draft_tokens.unsqueeze(1)  # [R, K]
        greedy = self.temperature == 0.0
        if greedy:
            target_tokens = self.argmax(target_logits)  # [R, K+1]
        else:
            probs = logits_to_probs(target_logits, self.temperature, self.top_k, self.top_p)
        if self.mode == "synthetic":
            u, rates = self.synthetic_draws(num_rows, k, draft_tokens.device)
            accepted = _accepted_prefix_len((u < rates) & is_draft)
            if greedy:
                last = target_tokens.gather(1, accepted.unsqueeze(1)).squeeze(1)
            else:
                last_probs = probs.gather(1, accepted.view(-1, 1, 1).expand(-1, 1, probs.shape[-1])).squeeze(1)
                last = sample_from_probs(last_probs, self.generator, self.argmax)
            return _emit(draft_tokens, accepted, last, samples)
        if greedy:
            accepted = _accepted_prefix_len((draft_tokens == target_tokens[:, :k]) & is_draft)
            last = target_tokens.gather(1, accepted.unsqueeze(1)).squeeze(1)
            return _emit(draft_tokens, accepted, last, samples)
        if k == 0:  # no drafts (plain decoding): the token comes from the target alone
            last = sample_from_probs(probs[:, 0], self.generator, self.argmax)
            return _emit(draft_tokens, torch.zeros_like(num_draft_tokens), last, samples)
        assert draft_probs is not None, "sampling verification needs the draft's probabilities"
        p_draft_tok = probs[:, :k].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # [R, K]
        q_draft_tok = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2)
        u = uniform((num_rows, k), draft_tokens.device, self.generator)
        accept = (u * q_draft_tok < p_draft_tok) & is_draft
        accepted = _accepted_prefix_len(accept)
        vocab = probs.shape[-1]
        p_at = probs.gather(1, accepted.view(-1, 1, 1).expand(-1, 1, vocab)).squeeze(1)  # [R, V]
        padded_q = torch.cat([draft_probs, draft_probs.new_zeros(num_rows, 1, vocab)], dim=1)
        q_at = padded_q.gather(1, accepted.view(-1, 1, 1).expand(-1, 1, vocab)).squeeze(1)
        residual = (p_at - q_at).clamp_min(0.0)
        residual_mass = residual.sum(dim=-1, keepdim=True)
        # All drafts accepted (or none proposed): the bonus comes from p. p == q exactly: residual is empty.
        use_residual = (accepted < num_draft_tokens).unsqueeze(1) & (residual_mass > 0)
        last_probs = torch.where(use_residual, residual / residual_mass.clamp_min(1e-30), p_at)
        last = sample_from_probs(last_probs, self.generator, self.argmax)
        return _emit(draft_tokens, accepted, last, samples)
