"""Greedy verification of a step's rows in one Triton kernel (`engine.sampler_kernel=triton`): from the target's
argmax tokens to the step's output rows, with what the torch path computes in about twenty small kernels.

Per row r (one program), with the step's row inputs (`NativeEngine.row_inputs`: K + 1 scoring columns, then the
row's draft-buffer row d, its number of drafts n, whether it samples s, its conv slot):

    n'        = min(n, draft_lengths[d]) under the confidence rule, else n
    accept_j  = j < n' and (drafts[d, j] == target[r, j]    greedy verification
                            u[r, j] < rate_j                  synthetic acceptance)         for j < v
    a         = the length of accept's leading run of True
    out[r]    = drafts[d, :a], target[r, a], then -1 up to column K; out[r, K+1] = a + 1, out[r, K+2] = n'
                (a row that does not sample: -1 everywhere, 0 and 0)

which is `RejectionSampler`'s greedy result written as `NativeEngine._sample` writes it, token for token. u is
drawn by the caller as the torch path draws it, so the same generator state gives the same tokens.

Why: a batch-1 decode step on an H200 is bound by its kernel count; outside the model, a k = 0 verify graph ran 23
small ops (counted on the CPU: compares, wheres, an arange, a cumprod, gathers, copies) to turn the argmax into
the step's output.

With the Triton argmax (`engine.argmax_kernel=triton`, `sampling.TritonArgmax`) the argmax and this kernel share
one launch (:func:`argmax_greedy_verify`): each of the v + 1 logits rows of a request is cut into chunks, one
program each; a row's last program to finish (a per-row ticket) reduces the row, and a request's last row to be
reduced (a per-request ticket) verifies the request. A plain decode step then ends in one launch after the LM
head instead of three; on an H100 (2026-12-07) its time did not measurably change
(`experiments/2026-12-07-one-launch-argmax-h100/`; `engine.argmax_kernel=triton_two_launches` keeps three).

Importable without Triton (`AVAILABLE` False); the kernel needs a CUDA device, or Triton's interpreter
(`TRITON_INTERPRET=1`) for CPU tensors.
"""

from __future__ import annotations

import torch

from specexp.engine.rejection_sampler import RejectionSampler
from specexp.engine.sampling import TritonArgmax
from specexp.models import triton_argmax
from specexp.models.triton_support import AVAILABLE, arrive_last, tl, triton

if AVAILABLE:
    from specexp.models.triton_argmax import argmax_in_one_launch


    @triton.jit
    def _verify_row(r, target_ptr, rows_ptr, drafts_ptr, lengths_ptr, u_ptr, rates_ptr, out_ptr, rate, v, K,
                    stride_target, stride_rows, stride_drafts, stride_u, stride_out, HAS_DRAFTS: tl.constexpr,
                    CONFIDENCE: tl.constexpr, SYNTHETIC: tl.constexpr, RATES: tl.constexpr, BLOCK: tl.constexpr,
                    FRESH_TARGET: tl.constexpr):
        """Row r's output (the module doc). FRESH_TARGET: its target tokens were written by other programs of this
        launch (read from L2)."""
        cols = tl.arange(0, BLOCK)
        row = rows_ptr + r * stride_rows
        d = tl.load(row + K + 1)
        n = tl.load(row + K + 2)
        samples = tl.load(row + K + 3) != 0
        if CONFIDENCE:
            n = tl.minimum(n, tl.load(lengths_ptr + d))
        if FRESH_TARGET:
            target = tl.load(target_ptr + r * stride_target + cols, mask=cols <= v, other=-1, cache_modifier=".cg")
        else:
            target = tl.load(target_ptr + r * stride_target + cols, mask=cols <= v, other=-1)
        is_draft = (cols < v) & (cols < n)
        if HAS_DRAFTS:
            drafts = tl.load(drafts_ptr + d * stride_drafts + cols, mask=cols < v, other=0)
        else:
            drafts = tl.zeros([BLOCK], dtype=tl.int64)
        if SYNTHETIC:
            u = tl.load(u_ptr + r * stride_u + cols, mask=cols < v, other=1.0)
            if RATES:
                threshold = tl.load(rates_ptr + cols, mask=cols < v, other=0.0)
            else:
                threshold = rate
            accept = (u < threshold) & is_draft
        else:
            accept = (drafts == target) & is_draft
        a = tl.min(tl.where(accept, BLOCK, cols), axis=0)  # the first rejected column
        a = tl.minimum(a, v)
        last = tl.sum(tl.where(cols == a, target, 0), axis=0)
        sampled = tl.where(cols < a, drafts, tl.where(cols == a, last, -1))
        sampled = tl.where(samples, sampled, -1)
        out = out_ptr + r * stride_out
        tl.store(out + cols, sampled, mask=cols <= K)
        tl.store(out + K + 1, tl.where(samples, a + 1, 0).to(tl.int64))
        tl.store(out + K + 2, tl.where(samples, n, 0).to(tl.int64))


    @triton.jit
    def _greedy_verify_kernel(target_ptr, rows_ptr, drafts_ptr, lengths_ptr, u_ptr, rates_ptr, out_ptr, rate,
                              v, K, stride_target, stride_rows, stride_drafts, stride_u, stride_out,
                              HAS_DRAFTS: tl.constexpr, CONFIDENCE: tl.constexpr, SYNTHETIC: tl.constexpr,
                              RATES: tl.constexpr, BLOCK: tl.constexpr):
        _verify_row(tl.program_id(0), target_ptr, rows_ptr, drafts_ptr, lengths_ptr, u_ptr, rates_ptr, out_ptr,
                    rate, v, K, stride_target, stride_rows, stride_drafts, stride_u, stride_out, HAS_DRAFTS,
                    CONFIDENCE, SYNTHETIC, RATES, BLOCK, False)


    @triton.jit
    def _argmax_verify_kernel(logits_ptr, max_ptr, index_ptr, nan_ptr, tickets_ptr, target_ptr, rows_ptr,
                              drafts_ptr, lengths_ptr, u_ptr, rates_ptr, out_ptr, rate, V, stride_x, num_chunks,
                              num_rows, v, K, stride_rows, stride_drafts, stride_u, stride_out,
                              HAS_DRAFTS: tl.constexpr, CONFIDENCE: tl.constexpr, SYNTHETIC: tl.constexpr,
                              RATES: tl.constexpr, BLOCK: tl.constexpr, BLOCK_V: tl.constexpr,
                              CHUNKS: tl.constexpr):
        """The argmax of logits row (r, j) (one program per chunk of it) and, once all v + 1 rows of request r have
        theirs, request r's verification, in one launch: the last chunk program of a row (by tickets[row]) reduces
        it into target[row]; the last row of a request (by tickets[num_rows + r]) verifies it. Both counters are
        left at 0."""
        row = tl.program_id(0)
        if argmax_in_one_launch(logits_ptr, max_ptr, index_ptr, nan_ptr, tickets_ptr, target_ptr, V, stride_x,
                                num_chunks, 1, row, tl.program_id(1), BLOCK_V, CHUNKS):
            r = row // (v + 1)
            if arrive_last(tickets_ptr + num_rows + r, v + 1):  # the request's other rows have their argmax
                _verify_row(r, target_ptr, rows_ptr, drafts_ptr, lengths_ptr, u_ptr, rates_ptr, out_ptr, rate, v,
                            K, v + 1, stride_rows, stride_drafts, stride_u, stride_out, HAS_DRAFTS, CONFIDENCE,
                            SYNTHETIC, RATES, BLOCK, True)


def _verify_operands(caller: str, v: int, row_inputs: torch.Tensor, step_out: torch.Tensor, k: int,
                     draft_tokens: torch.Tensor | None, draft_lengths: torch.Tensor | None,
                     u: torch.Tensor | None, rates: torch.Tensor | float | None) -> dict:
    """The verification's arguments by the name both kernels give them (rows_ptr .. out_ptr, rate, v, K, the
    strides but the target's, the constexprs); ValueError naming `caller` where they disagree."""
    if v > k or (v > 0 and draft_tokens is None) or (u is None) != (rates is None):
        raise ValueError(f"triton_verify.{caller}: v={v} drafts for k={k}, draft buffer "
                         f"{draft_tokens is not None}, u {u is not None}, rates {rates is not None}")
    rates_tensor = rates if isinstance(rates, torch.Tensor) else None
    dummy = row_inputs  # stands for the pointers a constexpr leaves unread
    return {
        "rows_ptr": row_inputs, "drafts_ptr": draft_tokens if draft_tokens is not None else dummy,
        "lengths_ptr": draft_lengths if draft_lengths is not None else dummy, "u_ptr": u if u is not None else dummy,
        "rates_ptr": rates_tensor if rates_tensor is not None else dummy, "out_ptr": step_out,
        "rate": float(rates) if rates is not None and rates_tensor is None else 0.0, "v": v, "K": k,
        "stride_rows": row_inputs.stride(0), "stride_drafts": draft_tokens.stride(0) if draft_tokens is not None else 0,
        "stride_u": u.stride(0) if u is not None else 0, "stride_out": step_out.stride(0),
        "HAS_DRAFTS": v > 0, "CONFIDENCE": draft_lengths is not None, "SYNTHETIC": u is not None,
        "RATES": rates_tensor is not None, "BLOCK": max(triton.next_power_of_2(k + 1), 2)}


def greedy_verify(target_tokens: torch.Tensor, row_inputs: torch.Tensor, step_out: torch.Tensor, k: int,
                  draft_tokens: torch.Tensor | None, draft_lengths: torch.Tensor | None = None,
                  u: torch.Tensor | None = None, rates: torch.Tensor | float | None = None) -> None:
    """Write step_out[:R] from the target's argmax tokens, as `NativeEngine._sample` does under greedy
    verification (see the module doc).

    target_tokens: int64[R, v+1] (v: the most drafts a row carries this step, <= k); row_inputs: int64[>=R, k+5]
    (the engine's); step_out: int64[>=R, k+3], rows [0, R) written; draft_tokens: int64[max_reqs, >=v], the
    speculator's draft buffer (None when v = 0); draft_lengths: int64[max_reqs] under the confidence rule, else
    None; u: fp32[R, v] uniform draws and `rates` (a float, or fp32[>=v] per position) for synthetic acceptance,
    else None."""
    num_rows, v = target_tokens.shape[0], target_tokens.shape[1] - 1
    if num_rows == 0:
        return
    operands = _verify_operands("greedy_verify", v, row_inputs, step_out, k, draft_tokens, draft_lengths, u, rates)
    _greedy_verify_kernel[(num_rows,)](target_ptr=target_tokens, stride_target=target_tokens.stride(0), **operands,
                                       num_warps=1)


def argmax_greedy_verify(logits: torch.Tensor, tickets: torch.Tensor, row_inputs: torch.Tensor,
                         step_out: torch.Tensor, k: int, draft_tokens: torch.Tensor | None,
                         draft_lengths: torch.Tensor | None = None, u: torch.Tensor | None = None,
                         rates: torch.Tensor | float | None = None) -> torch.Tensor:
    """`triton_argmax.argmax` of logits fp32[R, v+1, V] then :func:`greedy_verify`, in one launch: returns the
    target tokens int64[R, v+1] and writes step_out[:R] as greedy_verify does (its arguments'). tickets:
    `triton_argmax.new_tickets` of at least R (v+1) + R on logits' device (left at 0)."""
    num_rows, v = logits.shape[0], logits.shape[1] - 1
    num_logit_rows = num_rows * (v + 1)
    if not triton_argmax.supports(logits) or logits.dim() != 3:
        raise ValueError(f"triton_verify.argmax_greedy_verify takes logits [R, v+1, V] that triton_argmax takes; "
                         f"got {logits.dtype} of shape {tuple(logits.shape)}")
    if tickets.dtype != torch.int32 or tickets.device != logits.device or tickets.shape[0] < num_logit_rows + num_rows:
        raise ValueError(f"triton_verify.argmax_greedy_verify: tickets must be int32 on {logits.device}, at least "
                         f"{num_logit_rows + num_rows}; got {tickets.dtype} of shape {tuple(tickets.shape)} on "
                         f"{tickets.device}")
    operands = _verify_operands("argmax_greedy_verify", v, row_inputs, step_out, k, draft_tokens, draft_lengths, u,
                                rates)
    target = torch.empty(num_rows, v + 1, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return target
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)  # rows evenly strided (triton_argmax.argmax's view)
    block_v, num_chunks, chunks_tile, partials = triton_argmax.chunk_scratch(num_logit_rows, vocab, logits.device)
    max_partials, index_partials, nan_partials = partials
    _argmax_verify_kernel[(num_logit_rows, num_chunks)](
        logits_ptr=rows, max_ptr=max_partials, index_ptr=index_partials, nan_ptr=nan_partials, tickets_ptr=tickets,
        target_ptr=target, V=vocab, stride_x=rows.stride(0), num_chunks=num_chunks, num_rows=num_logit_rows,
        **operands, BLOCK_V=block_v, CHUNKS=chunks_tile, num_warps=triton_argmax.NUM_WARPS)
    return target


def sample_greedy_rows(logits: torch.Tensor, rejection: RejectionSampler, speculator, row_inputs: torch.Tensor,
                       step_out: torch.Tensor, k: int) -> None:
    """`NativeEngine._sample` under greedy verification, on :func:`greedy_verify`: synthetic acceptance's draws
    where the run has them (drawn as the torch path draws them), the argmax of logits fp32[R, v+1, V]
    (`rejection.argmax`), then one kernel writing step_out[:R]; with the Triton argmax on its device
    (`sampling.TritonArgmax`), argmax and verification in one launch (:func:`argmax_greedy_verify`).
    speculator: the engine's (its draft buffer and, under the confidence rule, its draft lengths) or None."""
    num_rows, v = logits.shape[0], logits.shape[1] - 1
    u = rates = None
    if rejection.mode == "synthetic":  # drawn before the argmax, which draws nothing: the torch path's numbers
        u, rates = rejection.synthetic_draws(num_rows, v, logits.device)
    lengths = None
    if speculator is not None and speculator.confidence_threshold > 0:
        lengths = speculator.draft_lengths
    drafts = speculator.draft_tokens if speculator is not None else None
    argmax = rejection.argmax
    tickets = argmax.verify_tickets(logits) if isinstance(argmax, TritonArgmax) else None
    if tickets is not None:
        argmax_greedy_verify(logits, tickets, row_inputs, step_out, k, drafts, lengths, u, rates)
        return
    greedy_verify(argmax(logits), row_inputs, step_out, k, drafts, lengths, u, rates)
