"""A step's one device-to-host copy: what the sampler emitted per row, read back while the draft still runs.

On a GPU the copy lands in page-locked host memory, so it is asynchronous, and an event says when it has landed.
Two buffers and two events, used by alternate steps: with plain-decoding lookahead (`engine.plain_decode_lookahead`)
a step's read-back is queued before the previous one has been consumed. On a CPU the copy is done on return.
"""

from __future__ import annotations

import torch


class StepReadBack:
    """Preallocated read-back buffers: two int64[max_rows, width] host tensors (page-locked when `pin_memory`) and,
    on a CUDA device, an event each."""

    def __init__(self, max_rows: int, width: int, device: torch.device, pin_memory: bool) -> None:
        self.host = [torch.zeros(max_rows, width, dtype=torch.int64, pin_memory=pin_memory) for _ in range(2)]
        self.done = [torch.cuda.Event() for _ in range(2)] if device.type == "cuda" else None
        self._slot = 0

    def start(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Queue the copy of `out` (int64[R, width] on the device, R <= max_rows) on the current stream. Returns
        (host view int64[R, width], event): the view holds `out` once the event has fired; on a CPU a copy made on
        return, and no event."""
        if self.done is None:
            return out.clone(), None
        self._slot ^= 1
        host = self.host[self._slot][: out.shape[0]]
        host.copy_(out, non_blocking=True)
        done = self.done[self._slot]
        done.record()
        return host, done
