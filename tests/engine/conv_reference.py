"""Independent reference for the short-conv tests: a full-sequence causal conv over a committed stream.

Nothing here shares code with `specexp.models.short_conv_ops`; the ops are checked against
`torch.nn.functional.conv1d`, the operator transformers' LFM2 uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(stream: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """out[t] = bias + sum_j weight[:, j] * stream[t - (W-1) + j] (zeros before the start).

    stream: [L, D]; weight: [D, W]; bias: [D] or None. Returns [L, D].
    """
    length, dim = stream.shape
    width = weight.shape[1]
    if length == 0:
        return stream.new_zeros(0, dim)
    out = F.conv1d(stream.T.unsqueeze(0), weight.unsqueeze(1), bias, padding=width - 1, groups=dim)
    return out[0, :, :length].T


def last_window(stream: torch.Tensor, width: int) -> torch.Tensor:
    """[D, W-1]: the last W-1 inputs of `stream` ([L, D]), oldest first, zero-padded on the left."""
    dim = stream.shape[1]
    padded = torch.cat([stream.new_zeros(width - 1, dim), stream])
    return padded[padded.shape[0] - (width - 1):].T


def conv_of_appended(
    committed: torch.Tensor, new: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """[q, D]: what the conv gives `new` ([q, D]) when it follows the committed stream ([L, D])."""
    stream = torch.cat([committed, new])
    return causal_conv(stream, weight, bias)[committed.shape[0]:]
