"""One small CUDA graph per shape around a launch on the host's critical path.

At batch 1 a step's host work between the verify's read-back and the next verify's launch has to fit in the
time the device spends on the draft (~0.2 ms for a 100M draft on an H100 at k = 1). A Triton kernel's launch
from Python costs tens of µs of that (argument specialisation, the launcher), a graph replay a few. A launch
whose arguments are all persistent buffers and host constants that the key determines (the steady step's
advance kernel, `verify_advance`) is therefore captured once per key and replayed after.

The first call for a key launches eagerly (compiling and loading the kernel, and doing this step's work), then
captures the same launch on a side stream without running it; later calls replay. The capture neither
synchronises the device nor touches the caching allocator (no `torch.cuda.graph` block): it must not allocate.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch


class LaunchGraphs:
    """Launches replayed from one CUDA graph per key; eager where disabled (CPU tensors, emulated graphs)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}

    @property
    def num_graphs(self) -> int:
        """Keys captured so far."""
        return len(self._graphs)

    def run(self, key: Hashable, launch: Callable[[], None]) -> None:
        """Do `launch()`'s work on the current stream: replay key's graph, or (first call) launch eagerly and
        capture. `launch` must read and write only tensors that outlive the graph, at the same addresses on every
        call with this key, and allocate nothing."""
        if not self.enabled:
            launch()
            return
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        launch()
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream(device=current.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                launch()
            finally:
                graph.capture_end()
        current.wait_stream(side)
        self._graphs[key] = graph
