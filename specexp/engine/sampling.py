"""Token distributions and sampling on the device, without device-to-host syncs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specexp.engine.compiled_graphs import RandomTape
from specexp.models import triton_argmax, triton_support


def torch_argmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """torch.argmax(x, dim=-1): x [..., V] -> int64[...], written into `out` (x.shape[:-1], any stride) when
    given and returned."""
    if out is None:
        return x.argmax(dim=-1)
    return out.copy_(x.argmax(dim=-1))


class TritonArgmax:
    """:func:`torch_argmax`, the same indices, on the Triton argmax where it takes x (`triton_argmax.supports`, on
    `device`): one block per row of a 128K vocabulary made torch's a tenth of a small draft's decode step
    (`specexp.models.triton_argmax`). Up to `max_rows` rows run in one launch, on counters of its own
    (`tickets`, int32[2 max_rows]: one per row, and one per request where a verification shares the launch,
    `triton_verify.argmax_greedy_verify`); more rows in two. Calls on one stream may share an instance; calls
    that may run at the same time need one each. On a CUDA device, or on CPU tensors under Triton's interpreter
    (`TRITON_INTERPRET=1`, tests); elsewhere torch's argmax."""

    def __init__(self, device: torch.device | str, max_rows: int) -> None:
        device = torch.device(device)
        runs = triton_argmax.AVAILABLE and (device.type == "cuda" or triton_support.INTERPRETER)
        self.tickets = triton_argmax.new_tickets(2 * max_rows, device) if runs else None  # max_rows 0: two launches

    def launches_on(self, x: torch.Tensor) -> bool:
        """Whether x goes to the Triton kernels (the one-launch kernel where it has at most max_rows rows)."""
        return self.tickets is not None and x.device == self.tickets.device and triton_argmax.supports(x)

    def verify_tickets(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The tickets for `triton_verify.argmax_greedy_verify` of logits [R, v+1, V] (R (v+1) rows and R requests)
        where they suffice and the Triton kernels take the logits; else None."""
        if not self.launches_on(logits) or logits.dim() != 3:
            return None
        return self.tickets if self.tickets.shape[0] >= logits.shape[0] * (logits.shape[1] + 1) else None

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.launches_on(x) and (out is None or out.dim() <= 1 or out.is_contiguous()):
            rows = x.numel() // x.shape[-1]
            return triton_argmax.argmax(x, out, self.tickets if rows <= self.tickets.shape[0] // 2 else None)
        return torch_argmax(x, out)


def torch_argmax_for(device: torch.device, max_rows: int) -> Argmax:
    """:func:`torch_argmax` (it needs nothing per caller)."""
    return torch_argmax


def triton_two_launches(device: torch.device, max_rows: int) -> Argmax:
    """The Triton argmax always in two launches (no tickets), and greedy verification in a launch of its own: the
    one-launch paths' baseline."""
    return TritonArgmax(device, 0)


# The argmax over the vocabulary that greedy drafting, greedy verification and the exponential race run
# (`engine.argmax_kernel`): f(x [..., V], out=None) -> int64[...], made per caller by
# ARGMAX_KERNELS[name](device, max_rows), max_rows the most rows one call takes in one launch.
Argmax = Callable[..., torch.Tensor]
ARGMAX_KERNELS: dict[str, Callable[[torch.device, int], Argmax]] = {
    "torch": torch_argmax_for, "triton": TritonArgmax, "triton_two_launches": triton_two_launches}
TRITON_ARGMAX_KERNELS = ("triton", "triton_two_launches")


def logits_to_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution from logits [..., V] (fp32): temperature, then top-k, then top-p (nucleus).

    temperature must be > 0 (greedy decoding uses argmax, not probabilities). Returns probs [..., V].
    """
    logits = logits.float() / temperature
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


# What the samplers draw from: a torch.Generator (None: the device's default) or, in steps compiled for a CPU, a
# `compiled_graphs.RandomTape` that hands out the numbers the generator would give.
RandomSource = torch.Generator | RandomTape | None


def uniform(shape: tuple[int, ...], device: torch.device, generator: RandomSource) -> torch.Tensor:
    """U[0, 1) float32 of `shape`: torch.rand(shape, generator=generator), or the tape's numbers for it."""
    if isinstance(generator, RandomTape):
        return generator.uniform(shape, device)
    return torch.rand(shape, device=device, generator=generator)


def exponential_like(like: torch.Tensor, generator: RandomSource) -> torch.Tensor:
    """Exp(1) noise of like's shape and dtype: empty_like(like).exponential_(generator=generator), or the tape's."""
    if isinstance(generator, RandomTape):
        return generator.exponential_like(like)
    return torch.empty_like(like).exponential_(generator=generator)


def sample_from_probs(probs: torch.Tensor, generator: RandomSource, argmax: Argmax = torch_argmax,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of probs [..., V] by the exponential race (argmax of p / Exp(1)); no sync.

    Returns int64 [...] (written into `out` when given); `argmax`: an :data:`ARGMAX_KERNELS` entry.
    """
    return argmax(probs / exponential_like(probs, generator), out)
