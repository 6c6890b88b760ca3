"""CUDA-graph capture and replay of fixed-shape step functions, with per-size capture cost.

A `CudaGraphManager` captures one function (`fn(desc)`, reading only persistent buffers) for a set of
(batch size, k) keys x key-length buckets, each a `BatchExecutionDescriptor` of `num_reqs` rows x
`tokens_per_req + tokens_per_draft * k` tokens whose rows have at most `max_seq_len` keys; k is the step's
speculation depth the function is specialised to (vLLM's `specialize_spec_tokens`: the verify of k drafts, the
draft prefill of their region, the draft's k - 1 decode steps), 0 for managers that do not depend on it. At run
time a uniform batch is padded up to the smallest capture size that holds it and replayed with the smallest
bucket its longest row fits in; anything else (mixed batches, prefills, batches larger than the largest size)
runs eagerly and is counted. A uniform batch whose (size, k) was left out of the capture runs eagerly too, and is
counted per (size, k) (`num_eager_uncaptured`): nothing is ever captured after start-up. `PromptGraphs`
holds one such manager per token count N, each of one row of N tokens, for the prompt-prefill graphs
(`engine.cudagraph_prefill_tokens`): a lone prompt chunk is padded up to the smallest N that holds it.

Why buckets: attention shapes are fixed at capture, so a graph attends over its bucket's keys whatever the
rows' real lengths. One graph at `max_model_len` makes every short-context step pay for the longest context
(e.g. 4096 keys per layer for a 200-token request); buckets 256, 512, ... cap that waste at 2x the real
length, for more graphs in the same shared pool.

On a CPU device there are no CUDA graphs. With `compile_on_cpu` (the engine's `cudagraph_mode=full` on a CPU)
"capture" compiles the function once per key with torch.compile and "replay" calls the compiled function
(`specexp.engine.compiled_graphs`); without it the manager *emulates* graphs (tests): "capture" runs the
warm-up, and "replay" calls the function again on the padded persistent buffers — the same padding and
buffer-refresh logic, checkable without a GPU.

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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specexp.engine.compiled_graphs import RandomTape, StepCompileError, compile_step

NONE, FULL = "none", "full"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    """How one step runs: `num_reqs` rows and `num_tokens` tokens (padded sizes under FULL) attending over
    `max_seq_len` keys per row — under FULL the captured key-length bucket (0: unbucketed), under NONE the
    step's own longest row, as passed to `dispatch`."""

    num_reqs: int
    num_tokens: int
    cg_mode: str = NONE
    max_seq_len: int = 0
    num_speculative_tokens: int = 0  # the step's k the function runs (specialised graphs: their key's k)


@dataclass
class CaptureRecord:
    """Cost of one captured (size, k, bucket): `capture_bytes` (free-memory delta), `reserved_bytes`
    (allocator reserved delta), `capture_s` (warm-up excluded), `first_run_s` (the warm-up run before the capture,
    synchronised: where kernels compile on first use, or load from Triton's and inductor's on-disk caches, and are
    autotuned). A step compiled for a CPU (`compiled_graphs`, `compiled` True): `capture_s` is its compile and first
    compiled run, the bytes 0."""

    manager: str
    num_reqs: int
    num_tokens: int
    max_seq_len: int
    capture_bytes: int
    reserved_bytes: int
    capture_s: float
    num_speculative_tokens: int = 0
    first_run_s: float = 0.0
    compiled: bool = False

    @property
    def compile_s(self) -> float:
        """Seconds this key spent compiling: its first run, and for a step compiled for a CPU its compile."""
        return record_compile_s(vars(self))


def record_compile_s(record: dict) -> float:
    """:attr:`CaptureRecord.compile_s` of a record as `summary()` lists it (`vars` of one)."""
    return record.get("first_run_s", 0.0) + (record["capture_s"] if record.get("compiled") else 0.0)


def graph_key(desc: BatchExecutionDescriptor) -> tuple[int, int, int]:
    """(rows, k, key-length bucket): how managers and their callers key what belongs to one captured graph."""
    return desc.num_reqs, desc.num_speculative_tokens, desc.max_seq_len


def key_label(num_reqs: int, k: int) -> str:
    """A (size, k) key as text ("4@k3"): the keys of `num_eager_uncaptured` in summaries."""
    return f"{num_reqs}@k{k}"


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


def free_device_bytes(device: torch.device) -> int:
    """Free device memory after syncing and returning the allocator's cached blocks (vLLM's measure)."""
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


@dataclass
class CudaGraphManager:
    """Captured graphs of one step function (e.g. "draft_decode") by (padded batch size, k, key-length bucket).

    name: label in metrics. capture_sizes: the row counts a batch is padded to. tokens_per_req,
    tokens_per_draft: a row runs tokens_per_req + tokens_per_draft * k tokens at depth k (uniform batches only).
    capture_keys: the (size, k) pairs to capture, sizes among capture_sizes; None = every size at k = 0 (a
    manager that does not depend on k). enabled: False on CPU or when graphs are off: then every batch is eager.
    seq_len_buckets: key-length buckets (tokens) to capture each key at; (0,) = one unbucketed graph per key (the
    function decides its key length). pool: the graph memory pool to capture into (a
    `torch.cuda.graph_pool_handle()` shared with other managers, see the module docstring); None = its own.
    """

    name: str
    capture_sizes: list[int]
    tokens_per_req: int
    device: torch.device
    enabled: bool = True
    seq_len_buckets: tuple[int, ...] = (0,)
    graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = field(default_factory=dict)
    records: list[CaptureRecord] = field(default_factory=list)
    num_replays: int = 0
    num_eager: int = 0
    replays_per_graph: dict[tuple[int, int, int], int] = field(default_factory=dict)
    pool: tuple | None = None
    tokens_per_draft: int = 0
    capture_keys: tuple[tuple[int, int], ...] | None = None
    # Uniform batches that ran eagerly because their (size, k) was left out of the capture, by (size, k).
    num_eager_uncaptured: dict[tuple[int, int], int] = field(default_factory=dict)
    # On a CPU: compile each key's function (True) rather than emulate its graph by calling fn again (False),
    # its random numbers drawn ahead of each call from `random_tape` (when the engine's samplers draw from one).
    compile_on_cpu: bool = False
    random_tape: RandomTape | None = None

    def __post_init__(self) -> None:
        self.capture_sizes = sorted(set(self.capture_sizes))
        self.seq_len_buckets = tuple(sorted(set(self.seq_len_buckets)))
        self.per_k = self.capture_keys is not None
        keys = self.capture_keys if self.per_k else [(size, 0) for size in self.capture_sizes]
        self.keys = tuple(sorted(set(keys)))
        self.emulated = self.device.type != "cuda"
        if self.pool is None and self.enabled and not self.emulated:
            self.pool = torch.cuda.graph_pool_handle()
        self._fn: Callable[[BatchExecutionDescriptor], None] | None = None
        self._compiled: dict[tuple[int, int, int], Callable[[], None]] = {}  # compile_on_cpu: by (size, k, bucket)
        self._draws: dict[tuple[int, int, int], list] = {}  # random_tape: each compiled key's draws (its plan)

    def tokens_for(self, k: int) -> int:
        """Tokens one row runs at depth k."""
        return self.tokens_per_req + self.tokens_per_draft * k

    def lookup(self, num_reqs: int, max_seq_len: int = 0, k: int = 0) -> BatchExecutionDescriptor | None:
        """The captured graph a uniform batch of num_reqs rows at depth k would replay (the smallest capture size
        holding it, the smallest bucket holding its longest row), or None. Counts nothing."""
        size = next((s for s in self.capture_sizes if s >= num_reqs), None)
        bucket = next((b for b in self.seq_len_buckets if b >= max_seq_len), None)
        if size is None or bucket is None or (size, k, bucket) not in self.graphs:
            return None
        return BatchExecutionDescriptor(size, size * self.tokens_for(k), FULL, bucket, k)

    def dispatch(self, num_reqs: int, num_tokens: int, uniform: bool, max_seq_len: int = 0, k: int = 0
                 ) -> BatchExecutionDescriptor:
        """The captured graph of a uniform batch of num_reqs rows at depth k (`lookup`), counted as a replay; else
        eager (NONE, at max_seq_len), counted, and also per (size, k) when only its key's capture was left out."""
        if self.enabled and uniform and num_tokens == num_reqs * self.tokens_for(k):
            desc = self.lookup(num_reqs, max_seq_len, k)
            if desc is not None:
                key = (desc.num_reqs, k, desc.max_seq_len)
                self.num_replays += 1
                self.replays_per_graph[key] = self.replays_per_graph.get(key, 0) + 1
                return desc
            size = next((s for s in self.capture_sizes if s >= num_reqs), None)
            if size is not None and (size, k) not in self.keys:
                self.num_eager_uncaptured[(size, k)] = self.num_eager_uncaptured.get((size, k), 0) + 1
        self.num_eager += 1
        return BatchExecutionDescriptor(num_reqs, num_tokens, NONE, max_seq_len, k)

    def capture(self, fn: Callable[[BatchExecutionDescriptor], None],
                prepare: Callable[[BatchExecutionDescriptor], None], progress: Callable[[str], None] | None = None
                ) -> None:
        """Capture fn for every (size, k) key at every bucket, largest first. prepare(desc) fills the persistent
        buffers with an inert dummy batch of that shape (writes nothing to any request's caches) before warm-up and
        capture. The only place graphs are added: dispatch never captures."""
        if not self.enabled:
            return
        self._fn = fn
        for size, k in sorted(self.keys, reverse=True):
            for bucket in sorted(self.seq_len_buckets, reverse=True):
                desc = BatchExecutionDescriptor(size, size * self.tokens_for(k), FULL, bucket, k)
                self._capture_one(fn, prepare, desc, progress)

    def _capture_one(self, fn, prepare, desc: BatchExecutionDescriptor, progress) -> None:
        size, k = desc.num_reqs, desc.num_speculative_tokens
        prepare(desc)
        key = graph_key(desc)
        compiling, tape = self.emulated and self.compile_on_cpu, self.random_tape
        if compiling and tape is not None:
            tape.record()
        start = time.perf_counter()
        fn(desc)  # warm-up: compiling, lazy initialisation, autotuning and workspace allocation happen outside capture
        if not self.emulated:
            torch.cuda.synchronize(self.device)
        first_run_s = time.perf_counter() - start
        self.graphs[key] = None if self.emulated else self._record_capture(fn, desc, first_run_s)
        if compiling:
            self._draws[key] = tape.recorded() if tape is not None else []
            self._compiled[key] = self._record_compile(fn, desc, key, first_run_s)
        if progress is not None:
            progress(f"{self.name} size {size} keys {desc.max_seq_len}" + (f" k {k}" if self.per_k else ""))

    def _record_capture(self, fn, desc: BatchExecutionDescriptor, first_run_s: float) -> torch.cuda.CUDAGraph:
        """Capture fn(desc) into a CUDA graph in the shared pool, recording its memory and time (and the seconds of
        its warm-up run, `first_run_s`)."""
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
            num_speculative_tokens=desc.num_speculative_tokens, first_run_s=first_run_s,
        ))
        return graph

    def _record_compile(self, fn, desc: BatchExecutionDescriptor, key, first_run_s: float) -> Callable[[], None]:
        """Compile fn(desc) for a CPU (`compiled_graphs.compile_step`), recording the compile time as capture_s."""
        start = time.perf_counter()
        try:
            with self._drawn(key):
                compiled = compile_step(fn, desc)
        except StepCompileError as exc:
            if not self._draws.get(key):
                raise
            # Inductor failed on the step with its random numbers read from the tape (it does on some shapes, e.g.
            # a 24-token vocabulary): compile it drawing them itself, which dynamo cuts at each generator call.
            cause = (str(exc.__cause__).strip().splitlines() or [""])[0]
            log.warning("%s %s: compiled with its random draws inside (inductor: %s)", self.name, key, cause)
            self._draws[key] = []
            compiled = compile_step(fn, desc)
        self.records.append(CaptureRecord(
            self.name, desc.num_reqs, desc.num_tokens, desc.max_seq_len, capture_bytes=0, reserved_bytes=0,
            capture_s=time.perf_counter() - start, num_speculative_tokens=desc.num_speculative_tokens,
            first_run_s=first_run_s, compiled=True,
        ))
        return compiled

    def _drawn(self, key):
        """The block a compiled key runs in: its random numbers drawn onto the tape first (none: nothing to do)."""
        draws = self._draws.get(key)
        return self.random_tape.play(draws) if draws else contextlib.nullcontext()

    @property
    def num_graphs_to_capture(self) -> int:
        """(size, k, bucket) graphs `capture` will capture (0 when disabled)."""
        return len(self.keys) * len(self.seq_len_buckets) if self.enabled else 0

    def execute(self, desc: BatchExecutionDescriptor, fn: Callable[[BatchExecutionDescriptor], None]) -> None:
        """Run one step as `dispatch` decided: replay its graph under FULL, else `fn(desc)` eagerly."""
        if desc.cg_mode == FULL:
            self.replay(desc)
        else:
            fn(desc)

    def replay(self, desc: BatchExecutionDescriptor) -> None:
        key = graph_key(desc)
        if not self.emulated:
            self.graphs[key].replay()
        elif key in self._compiled:
            with self._drawn(key):
                self._compiled[key]()
        else:
            self._fn(desc)

    def summary(self) -> dict:
        """Per-(size, k, bucket) capture records plus totals (bytes, seconds), replay/eager counts
        (`replays_per_graph` keyed "ROWSxKEYS@kK"), the captured (size, k) keys, the eager runs of keys left
        out (`num_eager_uncaptured`, keyed "ROWS@kK") and whether its graphs are specialised per k (`per_k`)."""
        return {
            "capture_bytes": sum(r.capture_bytes for r in self.records),
            "capture_s": sum(r.capture_s for r in self.records),
            "compile_s": sum(r.compile_s for r in self.records),
            "num_replays": self.num_replays,
            "num_eager": self.num_eager,
            "per_k": self.per_k,
            "replays_per_graph": {f"{rows}x{keys}@k{k}": n
                                  for (rows, k, keys), n in sorted(self.replays_per_graph.items())},
            "captured_keys": [key_label(size, k) for size, k in self.keys] if self.enabled else [],
            "num_eager_uncaptured": {key_label(size, k): n for (size, k), n in sorted(self.num_eager_uncaptured.items())},
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

    def holds(self, num_tokens: int, max_seq_len: int) -> bool:
        """Whether a captured graph holds a one-row chunk of num_tokens tokens whose row reaches max_seq_len keys
        (what `dispatch` would replay). Counts nothing."""
        fits = next((n for n in self.managers if n >= num_tokens), None)
        return fits is not None and self.managers[fits].lookup(1, max_seq_len) is not None

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
