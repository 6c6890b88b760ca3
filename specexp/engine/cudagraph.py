"""CUDA-graph capture and replay of fixed-shape step functions, with per-size capture cost.

A `CudaGraphManager` captures one function (`fn(desc)`, reading only persistent buffers) for a set of
batch sizes x key-length buckets, each a `BatchExecutionDescriptor` of `num_reqs` rows x `tokens_per_req`
tokens whose rows have at most `max_seq_len` keys. At run time a uniform batch is padded up to the smallest
captured size that holds it and replayed with the smallest bucket its longest row fits in; anything else
(mixed batches, prefills, batches larger than the largest size) runs eagerly and is counted. `PromptGraphs`
holds one such manager per token count N, each of one row of N tokens, for the prompt-prefill graphs
(`engine.cudagraph_prefill_tokens`): a lone prompt chunk is padded up to the smallest N that holds it.

Why buckets: attention shapes are fixed at capture, so a graph attends over its bucket's keys whatever the
rows' real lengths. One graph at `max_model_len` makes every short-context step pay for the longest context
(e.g. 4096 keys per layer for a 200-token request); buckets 256, 512, ... cap that waste at 2x the real
length, for more graphs in the same shared pool.

On a CPU device the manager *emulates* graphs (tests only): "capture" runs the warm-up, and "replay"
calls the function again on the padded persistent buffers — the same padding and buffer-refresh logic,
checkable without a GPU.

Memory is measured as vLLM does — device free memory before minus after capture, after emptying the
allocator's cache — and, beyond vLLM, per captured size, together with the allocator's reserved-bytes
delta and the capture wall time. Sizes are captured largest first so smaller graphs reuse the shared pool.

Pools: a manager captures into the pool it is given (`pool`), else into its own. Graphs of one pool must never
run concurrently: a graph's intermediates are free pool memory once its capture ends, which the next graph
captured into the pool may take. The engine replays every graph on one stream, one at a time, and graphs pass
data only through persistent buffers, so it gives all its managers one pool (as vLLM gives every manager its
process-wide pool): the pool then holds about the largest graph's intermediates instead of their sum. A size's
recorded memory is then what its capture added to the pool given every graph captured before it (most of it
lands on the first, largest graph). The engine's total (free memory before minus after all captures) also holds
what the warm-ups allocate outside any graph: on an H200, 78 MiB of the LFM2-1.2B pair's 410 MiB, pool or not.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

NONE, FULL = "none", "full"


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    """How one step runs: `num_reqs` rows and `num_tokens` tokens (padded sizes under FULL) attending over
    `max_seq_len` keys per row — under FULL the captured key-length bucket (0: unbucketed), under NONE the
    step's own longest row, as passed to `dispatch`."""

    num_reqs: int
    num_tokens: int
    cg_mode: str = NONE
    max_seq_len: int = 0


@dataclass
class CaptureRecord:
    """Cost of one captured size: `capture_bytes` (free-memory delta), `reserved_bytes` (allocator
    reserved delta), `capture_s` (warm-up excluded)."""

    manager: str
    num_reqs: int
    num_tokens: int
    max_seq_len: int
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


def default_seq_len_buckets(max_seq_len: int, block_size: int, smallest: int = 256) -> list[int]:
    """Key-length buckets (tokens, multiples of block_size): smallest, 2x, 4x, ... then max_seq_len itself
    (always the largest); a doubling within 25% of max_seq_len is left out (it would cost a capture per
    size and save almost nothing: 4096 beside 4105)."""
    step = -(-max(smallest, block_size) // block_size) * block_size
    buckets = []
    while step * 5 < max_seq_len * 4:
        buckets.append(step)
        step *= 2
    return [*buckets, max_seq_len]


@contextlib.contextmanager
def frozen_gc():
    """Move every live object out of the garbage collector's view for the block (`gc.freeze`).

    Each capture calls `gc.collect()` (inside `torch.cuda.graph`, and around every memory reading) and a
    collection walks every tracked object: with a model and its engine loaded that costs ~0.1 s, several times
    per captured graph. Frozen objects are skipped, so those collections only see what the capture itself
    creates; capture timings then measure capture, not the interpreter's heap (vLLM freezes gc likewise).
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def free_device_bytes(device: torch.device) -> int:
    """Free device memory after syncing and returning the allocator's cached blocks (vLLM's measure)."""
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


@dataclass
class CudaGraphManager:
    """Captured graphs of one step function (e.g. "draft_decode") by (padded batch size, key-length bucket).

    name: label in metrics. capture_sizes: row counts to capture. tokens_per_req: tokens each row runs
    (uniform batches only). enabled: False on CPU or when graphs are off — then every batch is eager.
    seq_len_buckets: key-length buckets (tokens) to capture each size at; (0,) = one unbucketed graph per
    size (the function decides its key length). pool: the graph memory pool to capture into (a
    `torch.cuda.graph_pool_handle()` shared with other managers, see the module docstring); None = its own.
    """

    name: str
    capture_sizes: list[int]
    tokens_per_req: int
    device: torch.device
    enabled: bool = True
    seq_len_buckets: tuple[int, ...] = (0,)
    graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = field(default_factory=dict)
    records: list[CaptureRecord] = field(default_factory=list)
    num_replays: int = 0
    num_eager: int = 0
    replays_per_graph: dict[tuple[int, int], int] = field(default_factory=dict)
    pool: tuple | None = None

    def __post_init__(self) -> None:
        self.capture_sizes = sorted(set(self.capture_sizes))
        self.seq_len_buckets = tuple(sorted(set(self.seq_len_buckets)))
        self.emulated = self.device.type != "cuda"
        if self.pool is None and self.enabled and not self.emulated:
            self.pool = torch.cuda.graph_pool_handle()
        self._fn: Callable[[BatchExecutionDescriptor], None] | None = None

    def dispatch(self, num_reqs: int, num_tokens: int, uniform: bool, max_seq_len: int = 0
                 ) -> BatchExecutionDescriptor:
        """The smallest captured size holding a uniform batch of num_reqs rows, at the smallest bucket holding
        its longest row (max_seq_len keys, after this step's tokens), else eager (NONE, at max_seq_len)."""
        if self.enabled and uniform and num_tokens == num_reqs * self.tokens_per_req:
            bucket = next((b for b in self.seq_len_buckets if b >= max_seq_len), None)
            for size in self.capture_sizes:
                if bucket is not None and size >= num_reqs and (size, bucket) in self.graphs:
                    self.num_replays += 1
                    self.replays_per_graph[(size, bucket)] = self.replays_per_graph.get((size, bucket), 0) + 1
                    return BatchExecutionDescriptor(size, size * self.tokens_per_req, FULL, bucket)
        self.num_eager += 1
        return BatchExecutionDescriptor(num_reqs, num_tokens, NONE, max_seq_len)

    def capture(self, fn: Callable[[BatchExecutionDescriptor], None],
                prepare: Callable[[BatchExecutionDescriptor], None], progress: Callable[[str], None] | None = None
                ) -> None:
        """Capture fn for every (size, bucket), largest first. prepare(desc) fills the persistent buffers with
        an inert dummy batch of that size (writes nothing to any request's caches) before warm-up and capture."""
        if not self.enabled:
            return
        self._fn = fn
        for size in sorted(self.capture_sizes, reverse=True):
            for bucket in sorted(self.seq_len_buckets, reverse=True):
                self._capture_one(fn, prepare, BatchExecutionDescriptor(size, size * self.tokens_per_req, FULL, bucket),
                                  progress)

    def _capture_one(self, fn, prepare, desc: BatchExecutionDescriptor, progress) -> None:
        size, key = desc.num_reqs, (desc.num_reqs, desc.max_seq_len)
        prepare(desc)
        fn(desc)  # warm-up: lazy initialisation, autotuning and workspace allocation happen outside capture
        self.graphs[key] = None if self.emulated else self._record_capture(fn, desc)
        if progress is not None:
            progress(f"{self.name} size {size} keys {desc.max_seq_len}")

    def _record_capture(self, fn, desc: BatchExecutionDescriptor) -> torch.cuda.CUDAGraph:
        """Capture fn(desc) into a CUDA graph in the shared pool, recording its memory and time."""
        torch.cuda.synchronize(self.device)
        free_before = free_device_bytes(self.device)
        reserved_before = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        start = time.perf_counter()
        with torch.cuda.graph(graph, pool=self.pool):
            fn(desc)
        torch.cuda.synchronize(self.device)
        capture_s = time.perf_counter() - start
        self.records.append(CaptureRecord(
            self.name, desc.num_reqs, desc.num_tokens, desc.max_seq_len,
            capture_bytes=free_before - free_device_bytes(self.device),
            reserved_bytes=torch.cuda.memory_reserved(self.device) - reserved_before, capture_s=capture_s,
        ))
        return graph

    @property
    def num_graphs_to_capture(self) -> int:
        """(size, bucket) pairs `capture` will capture (0 when disabled)."""
        return len(self.capture_sizes) * len(self.seq_len_buckets) if self.enabled else 0

    def execute(self, desc: BatchExecutionDescriptor, fn: Callable[[BatchExecutionDescriptor], None]) -> None:
        """Run one step as `dispatch` decided: replay its graph under FULL, else `fn(desc)` eagerly."""
        if desc.cg_mode == FULL:
            self.replay(desc)
        else:
            fn(desc)

    def replay(self, desc: BatchExecutionDescriptor) -> None:
        if self.emulated:
            self._fn(desc)
        else:
            self.graphs[(desc.num_reqs, desc.max_seq_len)].replay()

    def summary(self) -> dict:
        """Per-(size, bucket) capture records plus totals (bytes, seconds) and replay/eager counts
        (`replays_per_graph` keyed "ROWSxKEYS")."""
        return {
            "capture_bytes": sum(r.capture_bytes for r in self.records),
            "capture_s": sum(r.capture_s for r in self.records),
            "num_replays": self.num_replays,
            "num_eager": self.num_eager,
            "replays_per_graph": {f"{rows}x{keys}": n for (rows, keys), n in sorted(self.replays_per_graph.items())},
            "per_size": [vars(r) for r in self.records],
        }


class PromptGraphs:
    """Prompt-prefill graphs of one model: a `CudaGraphManager` per token count N (`name`_N), each of one row
    of N tokens at every key-length bucket. `managers`: {N: manager}, ascending (empty: none).

    pool: the graph pool every count's manager captures into; None = one pool of their own, shared by them (a
    model prefills one prompt chunk at a time, so its prompt graphs never run at once)."""

    def __init__(self, name: str, token_counts, device: torch.device, seq_len_buckets: tuple[int, ...],
                 pool: tuple | None = None) -> None:
        counts = sorted(set(token_counts))
        if pool is None and counts and device.type == "cuda":
            pool = torch.cuda.graph_pool_handle()
        self.managers = {n: CudaGraphManager(f"{name}_{n}", [1], n, device, seq_len_buckets=seq_len_buckets, pool=pool)
                         for n in counts}

    def dispatch(self, num_tokens: int, max_seq_len: int
                 ) -> tuple[BatchExecutionDescriptor, CudaGraphManager] | None:
        """The smallest count's manager holding a one-row chunk of num_tokens tokens and its descriptor (that
        manager's `dispatch`, which counts it); None when no count holds it."""
        fits = next((n for n in self.managers if n >= num_tokens), None)
        if fits is None:
            return None
        manager = self.managers[fits]
        return manager.dispatch(1, fits, True, max_seq_len), manager

    def capture(self, fn: Callable[[BatchExecutionDescriptor], None],
                prepare: Callable[[BatchExecutionDescriptor], None], progress: Callable[[str], None] | None = None
                ) -> None:
        """Capture every count's graphs (`CudaGraphManager.capture`), largest count first: the smaller ones
        reuse its intermediates' memory in the shared pool."""
        for n in sorted(self.managers, reverse=True):
            self.managers[n].capture(fn, prepare, progress)
