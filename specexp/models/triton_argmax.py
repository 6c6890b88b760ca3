"""argmax over the last dim of rows of logits (a vocabulary of ~10^5) in one or two short Triton launches, with
torch.argmax's result: the first index of the largest value, and the first NaN of a row that holds one.

Why: for one row torch's reduction runs the whole vocabulary in one block. On an H200 (2026-11-29,
`experiments/2026-11-29-cudagraphs-h200/capture_defaults.json`) that kernel took 0.027 ms of a batch-1 decode step
over 128,256 logits, a tenth of the Llama-100M draft's step, where reading 0.5 MB takes well under 0.01 ms at
copy bandwidth. Here the row is cut into BLOCK-wide chunks read by one program each (grid rows x chunks), each
writing its chunk's first NaN and first maximum; a second kernel (one program per row) picks among them. Given a
counter per row (`tickets`, :func:`new_tickets`), one launch does both: each program takes a ticket after storing
its chunk's partials, and the row's last program picks among them: a launch fewer in every decode step, though on
an H100 (2026-12-07) no step was measurably shorter for it (`experiments/2026-12-07-one-launch-argmax-h100/`).

Exactness: each chunk keeps its first maximum (ties to the left), and the row's reduction takes the first chunk
that holds the row's maximum, so the index is the first maximum of the row, as torch's; a row with a NaN gives its
first NaN, as torch's (NaN counts as the largest value). -inf rows give index 0.

Importable without Triton (`AVAILABLE` False); the kernels need a CUDA device, or Triton's interpreter
(`TRITON_INTERPRET=1`) for CPU tensors.
"""

from __future__ import annotations

import torch

from specexp.models.triton_support import AVAILABLE, arrive_last, tl, triton

# Values per program of the first kernel: 128,256 logits make 32 chunks (a 32-wide second reduction).
BLOCK = 4096
NUM_WARPS = 8
# The most chunks a row may have (the second kernel reads them in one tile): rows up to BLOCK * MAX_CHUNKS values.
MAX_CHUNKS = 1024


if AVAILABLE:

    @triton.jit
    def chunk_partials(x_ptr, max_ptr, index_ptr, nan_ptr, V, stride_x, num_chunks, row, chunk,
                        BLOCK: tl.constexpr):
        """Chunk `chunk` of row `row`: store its first NaN (V where it has none) and its first maximum among the
        other values, with that maximum, at partial row * num_chunks + chunk."""
        cols = chunk * BLOCK + tl.arange(0, BLOCK)
        ok = cols < V
        x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
        is_nan = x != x  # noqa: PLR0124 - the NaN test
        first_nan = tl.min(tl.where(is_nan, cols, V), axis=0)
        values = tl.where(is_nan, float("-inf"), x)
        best = tl.max(values, axis=0)
        first_best = tl.min(tl.where((values == best) & ok, cols, V), axis=0)
        out = row * num_chunks + chunk
        tl.store(max_ptr + out, best)
        tl.store(index_ptr + out, first_best)
        tl.store(nan_ptr + out, first_nan)


    @triton.jit
    def reduce_partials(max_ptr, index_ptr, nan_ptr, out_ptr, V, num_chunks, stride_out, row,
                         CHUNKS: tl.constexpr):
        """Row `row`'s argmax from its chunks' partials, stored at out_ptr + row * stride_out as int64. The
        partials are read from L2 (`.cg`): in the one-launch kernel other programs wrote them."""
        chunks = tl.arange(0, CHUNKS)
        ok = chunks < num_chunks
        at = row * num_chunks + chunks
        best = tl.load(max_ptr + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
        index = tl.load(index_ptr + at, mask=ok, other=V, cache_modifier=".cg")
        first_nan = tl.min(tl.load(nan_ptr + at, mask=ok, other=V, cache_modifier=".cg"), axis=0)
        top = tl.max(best, axis=0)
        # chunks are in column order, so the smallest index among the chunks holding the top value is the first
        first_best = tl.min(tl.where(best == top, index, V), axis=0)
        first_best = tl.where(first_best == V, 0, first_best)  # every value -inf (or masked): index 0, as torch
        result = tl.where(first_nan < V, first_nan, first_best)
        tl.store(out_ptr + row * stride_out, result.to(tl.int64))


    @triton.jit
    def _chunk_argmax_kernel(x_ptr, max_ptr, index_ptr, nan_ptr, V, stride_x, num_chunks, BLOCK: tl.constexpr):
        chunk_partials(x_ptr, max_ptr, index_ptr, nan_ptr, V, stride_x, num_chunks, tl.program_id(0),
                        tl.program_id(1), BLOCK)


    @triton.jit
    def _row_argmax_kernel(max_ptr, index_ptr, nan_ptr, out_ptr, V, num_chunks, stride_out, CHUNKS: tl.constexpr):
        reduce_partials(max_ptr, index_ptr, nan_ptr, out_ptr, V, num_chunks, stride_out, tl.program_id(0), CHUNKS)


    @triton.jit
    def argmax_in_one_launch(x_ptr, max_ptr, index_ptr, nan_ptr, tickets_ptr, out_ptr, V, stride_x, num_chunks,
                             stride_out, row, chunk, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
        """Both kernels' work for chunk `chunk` of row `row`, in a launch of one program per chunk: store the
        chunk's partials and arrive at tickets[row]; the row's last program to arrive reduces the row (into
        out_ptr + row * stride_out); the ticket is 0 again after it (`arrive_last`). Returns whether this program
        reduced the row."""
        chunk_partials(x_ptr, max_ptr, index_ptr, nan_ptr, V, stride_x, num_chunks, row, chunk, BLOCK)
        last = arrive_last(tickets_ptr + row, num_chunks)
        if last:  # every other chunk of the row has stored its partials
            reduce_partials(max_ptr, index_ptr, nan_ptr, out_ptr, V, num_chunks, stride_out, row, CHUNKS)
        return last


    @triton.jit
    def _argmax_kernel(x_ptr, max_ptr, index_ptr, nan_ptr, tickets_ptr, out_ptr, V, stride_x, num_chunks,
                       stride_out, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
        argmax_in_one_launch(x_ptr, max_ptr, index_ptr, nan_ptr, tickets_ptr, out_ptr, V, stride_x, num_chunks,
                             stride_out, tl.program_id(0), tl.program_id(1), BLOCK, CHUNKS)


def supports(x: torch.Tensor) -> bool:
    """Whether :func:`argmax` takes x: Triton present, an fp32 / fp16 / bf16 tensor of >= 1 dims whose last dim
    is contiguous, non-empty and at most BLOCK * MAX_CHUNKS long (values compare in fp32: exact for these)."""
    return (AVAILABLE and x.dim() >= 1 and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and 1 <= x.shape[-1] <= BLOCK * MAX_CHUNKS and x.stride(-1) == 1)


def chunk_scratch(num_rows: int, v: int, device: torch.device) -> tuple[int, int, int, tuple[torch.Tensor, ...]]:
    """For num_rows rows of v values: (BLOCK the chunks take, chunks a row, the reduction's power-of-2 tile of
    them, the partials' scratch: fp32 maxima, int32 first maximum's index, int32 first NaN's index, each
    [num_rows * chunks])."""
    block = min(BLOCK, triton.next_power_of_2(v))
    num_chunks = triton.cdiv(v, block)
    best = torch.empty(num_rows * num_chunks, dtype=torch.float32, device=device)
    index = torch.empty(num_rows * num_chunks, dtype=torch.int32, device=device)
    return block, num_chunks, max(triton.next_power_of_2(num_chunks), 2), (best, index, torch.empty_like(index))


def new_tickets(max_rows: int, device: torch.device | str) -> torch.Tensor:
    """int32[max_rows] of zeros: the per-row counters that let :func:`argmax` run in one launch for up to max_rows
    rows. Each launch leaves them 0 again, so one tensor serves every later call (and graph replay) on a stream;
    calls that may run at the same time need a tensor each."""
    return torch.zeros(max_rows, dtype=torch.int32, device=device)


def argmax(x: torch.Tensor, out: torch.Tensor | None = None, tickets: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., V] (last dim contiguous) -> int64[...], torch.argmax(x, dim=-1) exactly (first maximum; first NaN).

    out: an int64 tensor of x.shape[:-1] to write into, returned (1-D of any stride, e.g. a column of a token
    buffer, or contiguous); None: a new tensor. tickets: :func:`new_tickets` of at least x's row count on x's
    device: one launch, whose last program of each row reduces it; None (or too few): two launches. Capturable
    in a CUDA graph (scratch of rows x chunks)."""
    if not supports(x):
        raise ValueError(f"triton_argmax.argmax takes fp32/fp16/bf16 with a contiguous last dim of 1.."
                         f"{BLOCK * MAX_CHUNKS}; got {x.dtype} of shape {tuple(x.shape)}")
    v = x.shape[-1]
    rows = x.reshape(-1, v)  # a view where x's rows are evenly strided (a column slice, a contiguous tensor)
    num_rows = rows.shape[0]
    if out is None:
        out = torch.empty(x.shape[:-1], dtype=torch.int64, device=x.device)
    if (out.shape != x.shape[:-1] or out.dtype != torch.int64 or out.device != x.device
            or (out.dim() > 1 and not out.is_contiguous())):
        raise ValueError(f"triton_argmax.argmax: out must be int64 of shape {tuple(x.shape[:-1])} on {x.device}, "
                         f"1-D or contiguous; got {out.dtype} of shape {tuple(out.shape)} on {out.device}")
    if tickets is not None and (tickets.dtype != torch.int32 or tickets.device != x.device or tickets.dim() != 1):
        raise ValueError(f"triton_argmax.argmax: tickets must be new_tickets(rows, {x.device}), int32 1-D; got "
                         f"{tickets.dtype} of shape {tuple(tickets.shape)} on {tickets.device}")
    if num_rows == 0:
        return out
    flat_out = out.view(-1) if out.dim() != 1 else out
    block, num_chunks, chunks_tile, partials = chunk_scratch(num_rows, v, x.device)
    if tickets is not None and tickets.shape[0] >= num_rows:
        _argmax_kernel[(num_rows, num_chunks)](rows, *partials, tickets, flat_out, v, rows.stride(0), num_chunks,
                                               flat_out.stride(0), BLOCK=block, CHUNKS=chunks_tile,
                                               num_warps=NUM_WARPS)
        return out
    _chunk_argmax_kernel[(num_rows, num_chunks)](rows, *partials, v, rows.stride(0), num_chunks, BLOCK=block,
                                                 num_warps=NUM_WARPS)
    _row_argmax_kernel[(num_rows,)](*partials, flat_out, v, num_chunks, flat_out.stride(0), CHUNKS=chunks_tile,
                                    num_warps=1)
    return out
