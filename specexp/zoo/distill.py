"""Training losses: next-token cross-entropy, and distillation toward one or more frozen teachers.

Distillation minimises the forward KL from the teachers' next-token distribution to the student's
(the teacher distribution is the mean of the teachers' probabilities when there are several), mixed with
cross-entropy on the corpus: ``kl_weight * KL(p_teacher || p_student) + (1 - kl_weight) * CE``. A draft
trained this way puts its argmax where the target does more often than one trained on the corpus alone,
which is what greedy acceptance rewards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def next_token_logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, seq, vocab]`` logits of a HF causal LM for ``input_ids: int64[batch, seq]`` (no cache)."""
    return model(input_ids=input_ids, use_cache=False).logits


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats; ``logits: [batch, seq, vocab]``, ``labels: int64[batch, seq]``."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


@torch.no_grad()
def teacher_log_probs(teachers: list[torch.nn.Module], input_ids: torch.Tensor) -> torch.Tensor:
    """``float32[batch, seq, vocab]``: log of the teachers' mean next-token distribution."""
    log_probs = [F.log_softmax(next_token_logits(t, input_ids).float(), dim=-1) for t in teachers]
    if len(log_probs) == 1:
        return log_probs[0]
    return torch.logsumexp(torch.stack(log_probs), dim=0) - torch.log(torch.tensor(float(len(log_probs))))


def forward_kl(teacher_log_probs: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of ``KL(p_teacher || p_student)`` in nats; both ``[batch, seq, vocab]``."""
    student_log_probs = F.log_softmax(student_logits.float(), dim=-1)
    kl = F.kl_div(student_log_probs, teacher_log_probs, log_target=True, reduction="none").sum(-1)
    return kl.mean()


def distillation_loss(
    student_logits: torch.Tensor, teacher_log_probs: torch.Tensor, labels: torch.Tensor, kl_weight: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, kl, ce)``: the mixed objective and its two parts (nats per token)."""
    kl = forward_kl(teacher_log_probs, student_logits)
    ce = cross_entropy(student_logits, labels)
    return kl_weight * kl + (1.0 - kl_weight) * ce, kl, ce
