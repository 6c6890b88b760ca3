"""Token streams and training batches from the stdlib corpus.

A stream is every file of one split encoded as ``<|bos|> file <|eos|>`` and concatenated
(``int64[num_tokens]``). A training batch is ``batch_size`` windows of ``seq_len + 1`` tokens at offsets
drawn from a generator seeded by ``(seed, step)``, so batch ``s`` is the same whether or not the run was
interrupted and resumed before it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tokenizers import Tokenizer

from specexp.zoo.tokenizer import EOS_ID


def token_stream(tokenizer: Tokenizer, texts: Iterable[str]) -> torch.Tensor:
    """``int64[num_tokens]``: each text as ``<|bos|> text <|eos|>``, concatenated in order."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(list(texts)):
        ids.extend(encoding.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.int64)


def train_batch(stream: torch.Tensor, batch_size: int, seq_len: int, seed: int, step: int) -> torch.Tensor:
    """``int64[batch_size, seq_len + 1]`` random windows of ``stream`` (on ``stream``'s device) for ``step``."""
    if stream.numel() < seq_len + 2:
        raise ValueError(f"token stream has {stream.numel()} tokens, fewer than seq_len + 2 = {seq_len + 2}")
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    return stream[offsets.to(stream.device)]


def eval_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """``int64[n, seq_len + 1]``: the first ``n <= max_windows`` non-overlapping windows of ``stream``."""
    n = min(max_windows, (stream.numel() - 1) // seq_len)
    if n < 1:
        raise ValueError(f"token stream has {stream.numel()} tokens, too few for one window of {seq_len + 1}")
    offsets = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return stream[offsets.to(stream.device)]
