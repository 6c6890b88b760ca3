"""CUDA-graph capture and replay of fixed-shape step functions, with per-size capture cost.

A `CudaGraphManager` captures one function (`fn(desc)`, reading only persistent buffers) for a set of
batch sizes, each a `BatchExecutionDescriptor` of `num_reqs` rows x `tokens_per_req` tokens. At run time a
uniform batch is padded up to the smallest captured size that holds it and replayed; anything else (mixed
batches, prefills, batches larger than the largest size) runs eagerly and is counted.

On a CPU device the manager *emulates* graphs (tests only): "capture" runs the warm-up, and "replay"
calls the function again on the padded persistent buffers — the same padding and buffer-refresh logic,
checkable without a GPU.

Memory is measured as vLLM does — device free memory before minus after capture, after emptying the
allocator's cache — and, beyond vLLM, per captured size, together with the allocator's reserved-bytes
delta and the capture wall time. Sizes are captured largest first so smaller graphs reuse the shared pool.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

NONE, FULL = "none", "full"


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    """How one step runs: `num_reqs` rows and `num_tokens` tokens (padded sizes under FULL)."""

    num_reqs: int
    num_tokens: int
    cg_mode: str = NONE


@dataclass
class CaptureRecord:
    """Cost of one captured size: `capture_bytes` (free-memory delta), `reserved_bytes` (allocator
    reserved delta), `capture_s` (warm-up excluded)."""

    manager: str
    num_reqs: int
    num_tokens: int
    capture_bytes: int
    reserved_bytes: int
    capture_s: float


def default_capture_sizes(max_num_reqs: int) -> list[int]:
    """1, 2, 4, 8, ... up to max_num_reqs (always included)."""
    sizes, size = [], 1
    while size < max_num_reqs:
        sizes.append(size)
        size *= 2
    sizes.append(max_num_reqs)
    return sizes


def free_device_bytes(device: torch.device) -> int:
    """Free device memory after syncing and returning the allocator's cached blocks (vLLM's measure)."""
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


@dataclass
class CudaGraphManager:
    """Captured graphs of one step function (e.g. "draft_decode") by padded batch size.

    name: label in metrics. capture_sizes: row counts to capture. tokens_per_req: tokens each row runs
    (uniform batches only). enabled: False on CPU or when graphs are off — then every batch is eager.
    """

    name: str
    capture_sizes: list[int]
    tokens_per_req: int
    device: torch.device
    enabled: bool = True
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)
    records: list[CaptureRecord] = field(default_factory=list)
    num_replays: int = 0
    num_eager: int = 0

    def __post_init__(self) -> None:
        self.capture_sizes = sorted(set(self.capture_sizes))
        self.emulated = self.device.type != "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.enabled and not self.emulated else None
        self._fn: Callable[[BatchExecutionDescriptor], None] | None = None

    def dispatch(self, num_reqs: int, num_tokens: int, uniform: bool) -> BatchExecutionDescriptor:
        """The smallest captured size holding a uniform batch of num_reqs rows, else eager (NONE)."""
        if self.enabled and uniform and num_tokens == num_reqs * self.tokens_per_req:
            for size in self.capture_sizes:
                if size >= num_reqs and size in self.graphs:
                    self.num_replays += 1
                    return BatchExecutionDescriptor(size, size * self.tokens_per_req, FULL)
        self.num_eager += 1
        return BatchExecutionDescriptor(num_reqs, num_tokens, NONE)

    def capture(self, fn: Callable[[BatchExecutionDescriptor], None],
                prepare: Callable[[BatchExecutionDescriptor], None], progress: Callable[[str], None] | None = None
                ) -> None:
        """Capture fn for every size (largest first). prepare(desc) fills the persistent buffers with an
        inert dummy batch of that size (writes nothing to any request's caches) before warm-up and capture."""
        if not self.enabled:
            return
        self._fn = fn
        for size in sorted(self.capture_sizes, reverse=True):
            desc = BatchExecutionDescriptor(size, size * self.tokens_per_req, FULL)
            prepare(desc)
            fn(desc)  # warm-up: lazy initialisation, autotuning and workspace allocation happen outside capture
            if self.emulated:
                self.graphs[size] = None
                continue
            torch.cuda.synchronize(self.device)
            free_before = free_device_bytes(self.device)
            reserved_before = torch.cuda.memory_reserved(self.device)
            graph = torch.cuda.CUDAGraph()
            start = time.perf_counter()
            with torch.cuda.graph(graph, pool=self.pool):
                fn(desc)
            torch.cuda.synchronize(self.device)
            capture_s = time.perf_counter() - start
            self.graphs[size] = graph
            self.records.append(CaptureRecord(
                self.name, size, desc.num_tokens, capture_bytes=free_before - free_device_bytes(self.device),
                reserved_bytes=torch.cuda.memory_reserved(self.device) - reserved_before, capture_s=capture_s,
            ))
            if progress is not None:
                progress(f"{self.name} size {size}")

    def replay(self, desc: BatchExecutionDescriptor) -> None:
        if self.emulated:
            self._fn(desc)
        else:
            self.graphs[desc.num_reqs].replay()

    def summary(self) -> dict:
        """Per-size records plus totals (bytes, seconds) and replay/eager counts."""
        return {
            "capture_bytes": sum(r.capture_bytes for r in self.records),
            "capture_s": sum(r.capture_s for r in self.records),
            "num_replays": self.num_replays,
            "num_eager": self.num_eager,
            "per_size": [vars(r) for r in self.records],
        }
