"""The gated short conv of an LFM2 layer in one Triton kernel: for uniform batches (every decode and verify step)
and for batches of non-spec rows (prompt chunks, a draft's prefill regions).

`Lfm2ShortConv` computes `c * conv(b * x)` over each row's conv-state window, where b, c and x are the three
chunks of `in_proj(h)`. The default uniform path (`short_conv_ops.causal_conv1d_spec_update_uniform`) takes
about ten kernels a layer: the gating products, the state gather, the window gather, the concatenations,
the taps, the padding selects and the state scatter. Here one program per (row, block of channels) does all
of it:

    ext[d, :]   = state[slot, d, n-1 .. n+W-3] ++ (b*x)[row's q tokens, d]      (n = num_accepted, W = width)
    y[t, d]     = c[t, d] * (bias[d] + sum_j w[d, j] * ext[d, i + j])          (token t = row*q + i)
    state[slot, d, 0 .. W-3+q] = ext[d, 1 ..]                                  (later columns keep their values)

with the default path's conventions: window columns clamped into the state, NULL-slot rows (graph padding)
get zero outputs and leave every state untouched, tokens past R*q get zeros. b*x is rounded to the
activations' dtype before it is used (as the eager product is); the taps accumulate in fp32.

Non-spec rows (`short_conv_ops.causal_conv1d_varlen`: rows of any length laid out by query_start_loc, each
reading its window at column 0, or zeros where it has no initial state) take about twenty kernels a layer on
the default path (the varlen gathers, the taps, the selects, the state scatter). Here one program per (row,
block of BLOCK_T tokens, block of channels) computes its tokens' outputs, and the row's first token block also
writes the row's new state columns [0, W-1+L) = ext[q-L ..] (L: the lookahead inputs kept after the window):
only that program reads the row's state (BLOCK_T >= W-1), so it reads everything before it stores.

Importable without Triton (`AVAILABLE` False); the kernel needs a CUDA device or Triton's interpreter.
"""

from __future__ import annotations

import torch

from specexp.models.metadata import NULL_BLOCK_ID
from specexp.models.triton_support import AVAILABLE, early_launch_flags, tl, triton, wait_for_earlier_kernels

CHANNELS_PER_PROGRAM = 128

if AVAILABLE:

    @triton.jit
    def _gated_short_conv_kernel(
        bcx_ptr, w_ptr, bias_ptr, state_ptr, slots_ptr, accepted_ptr, y_ptr,
        stride_bcx, stride_ws, stride_ss, stride_sd, stride_y, dim, state_len,
        Q: tl.constexpr, W: tl.constexpr, HAS_BIAS: tl.constexpr, NULL_SLOT: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr, GDC: tl.constexpr = False,
    ):
        wait_for_earlier_kernels(GDC)  # launched early: every input may come from the kernel before
        row = tl.program_id(0)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        d_ok = d < dim
        slot = tl.load(slots_ptr + row).to(tl.int64)
        first_col = tl.load(accepted_ptr + row).to(tl.int32) - 1  # window starts at column n - 1
        live = slot != NULL_SLOT
        state_row = state_ptr + slot * stride_ss + d[:, None] * stride_sd
        token0 = row * Q

        # out[d, i] = sum_j w[d, j] * ext[d, i + j]: ext position e < W-1 is a window column, else b*x of token
        # e - (W-1) of the row
        i = tl.arange(0, BLOCK_Q)
        i_ok = i < Q
        acc = tl.zeros([BLOCK_D, BLOCK_Q], dtype=tl.float32)
        for j in tl.static_range(W):
            e = i + j
            from_state = e < W - 1
            col = tl.minimum(tl.maximum(first_col + e, 0), state_len - 1)
            s_val = tl.load(state_row + col[None, :], mask=d_ok[:, None] & (i_ok & from_state)[None, :], other=0.0)
            t = token0 + e - (W - 1)
            x_mask = d_ok[:, None] & (i_ok & (e >= W - 1))[None, :]
            b_val = tl.load(bcx_ptr + t[None, :] * stride_bcx + d[:, None], mask=x_mask, other=0.0)
            x_val = tl.load(bcx_ptr + t[None, :] * stride_bcx + 2 * dim + d[:, None], mask=x_mask, other=0.0)
            bx = (b_val * x_val).to(b_val.dtype).to(tl.float32)
            ext = tl.where(from_state[None, :], s_val.to(b_val.dtype).to(tl.float32), bx)
            w = tl.load(w_ptr + d * stride_ws + j, mask=d_ok, other=0.0).to(b_val.dtype).to(tl.float32)
            acc += w[:, None] * ext
        if HAS_BIAS:
            acc += tl.load(bias_ptr + d, mask=d_ok, other=0.0).to(tl.float32)[:, None]
        tokens = token0 + i
        out_mask = d_ok[:, None] & i_ok[None, :]
        c_val = tl.load(bcx_ptr + tokens[None, :] * stride_bcx + dim + d[:, None], mask=out_mask, other=0.0)
        conv = acc.to(c_val.dtype)  # the conv output rounds to the activations' dtype before the gate
        y = tl.where(live, (c_val * conv).to(tl.float32), 0.0)
        tl.store(y_ptr + tokens[None, :] * stride_y + d[:, None], y.to(y_ptr.dtype.element_ty), mask=out_mask)

        # new state columns [0, W-2+Q) = ext[1 ..]; read all of them before any store (same program)
        c = tl.arange(0, BLOCK_C)
        written = W - 2 + Q
        e = c + 1
        from_state = e < W - 1
        col = tl.minimum(tl.maximum(first_col + e, 0), state_len - 1)
        c_ok = c < written
        s_new = tl.load(state_row + col[None, :], mask=d_ok[:, None] & (c_ok & from_state)[None, :], other=0.0)
        t = token0 + e - (W - 1)
        x_mask = d_ok[:, None] & (c_ok & (e >= W - 1))[None, :]
        b_new = tl.load(bcx_ptr + t[None, :] * stride_bcx + d[:, None], mask=x_mask, other=0.0)
        x_new = tl.load(bcx_ptr + t[None, :] * stride_bcx + 2 * dim + d[:, None], mask=x_mask, other=0.0)
        # window columns pass through the activations' dtype, as the default path's concatenation does
        new = tl.where(from_state[None, :], s_new.to(b_new.dtype), (b_new * x_new).to(b_new.dtype)).to(s_new.dtype)
        tl.debug_barrier()
        tl.store(state_row + c[None, :], new, mask=d_ok[:, None] & c_ok[None, :] & live)


def supports(bcx: torch.Tensor, conv_state: torch.Tensor) -> bool:
    """Whether :func:`gated_short_conv_uniform` takes this layer: triton present, contiguous channel rows of
    bcx and a contiguous state."""
    return AVAILABLE and bcx.dim() == 2 and bcx.stride(1) == 1 and conv_state.is_contiguous()


def gated_short_conv_uniform(bcx: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             conv_state: torch.Tensor, state_indices: torch.Tensor,
                             num_accepted_tokens: torch.Tensor, query_len: int, num_rows: int,
                             pdl: bool = False) -> torch.Tensor:
    """c * short_conv(b * x) for the first R = num_rows rows of exactly q = query_len tokens each (row r at
    tokens r*q .. r*q+q-1), with (b, c, x) = bcx.chunk(3, dim=-1).

    bcx: [T >= R*q, 3 * D] (in_proj's output); weight [D, W]; bias [D] or None; conv_state [num_slots, D, S]
    (S >= W-2+q, updated in place); state_indices, num_accepted_tokens: int32[>= R] (NULL slot = padding).
    pdl (`engine.programmatic_launch`): on an sm_90+ GPU, launched with programmatic dependent launch (it waits for
    the kernels before it first thing; `triton_support.early_launch_flags`).
    Returns [T, D] in bcx's dtype: the gated conv output, zeros for padded rows and tokens past R*q.
    """
    num_tokens, dim = bcx.shape[0], bcx.shape[1] // 3
    width = weight.shape[1]
    weight = weight.contiguous()
    y = (torch.zeros if num_tokens > num_rows * query_len else torch.empty)(
        num_tokens, dim, device=bcx.device, dtype=bcx.dtype)
    if num_rows == 0:
        return y.zero_()
    _gated_short_conv_kernel[(num_rows, triton.cdiv(dim, CHANNELS_PER_PROGRAM))](
        bcx, weight, bias if bias is not None else weight, conv_state, state_indices, num_accepted_tokens, y,
        bcx.stride(0), weight.stride(0), conv_state.stride(0), conv_state.stride(1), y.stride(0), dim,
        conv_state.shape[2],
        Q=query_len, W=width, HAS_BIAS=bias is not None, NULL_SLOT=NULL_BLOCK_ID, BLOCK_D=CHANNELS_PER_PROGRAM,
        BLOCK_Q=max(2, triton.next_power_of_2(query_len)),
        BLOCK_C=max(2, triton.next_power_of_2(width - 2 + query_len)),
        num_warps=4, **early_launch_flags(pdl, bcx.device),
    )
    return y


TOKENS_PER_PROGRAM = 16

if AVAILABLE:

    @triton.jit
    def _varlen_ext(e, ok, row, start, state_row, state_len, initial_ptr, token_ptr, bcx_ptr, stride_bcx, dim, d,
                    d_ok, W: tl.constexpr, HAS_INITIAL: tl.constexpr, GATHER: tl.constexpr):
        """ext_r at positions e [BLOCK] of a row whose gathered tokens start at `start`, where `ok`: (window column e
        as stored, zeros without an initial state; the gated input b*x of the row's token e - (W-1), rounded to the
        activations' dtype; whether e is a window column), each [BLOCK_D, BLOCK]."""
        from_state = e < W - 1
        reads = ok & from_state
        if HAS_INITIAL:
            reads = reads & (tl.load(initial_ptr + row) != 0)
        window = tl.load(state_row + tl.minimum(e, state_len - 1)[None, :], mask=d_ok[:, None] & reads[None, :],
                         other=0.0)
        x_ok = ok & (e >= W - 1)
        p = start + e - (W - 1)
        if GATHER:
            t = tl.load(token_ptr + p, mask=x_ok, other=0)
        else:
            t = p
        x_mask = d_ok[:, None] & x_ok[None, :]
        b_val = tl.load(bcx_ptr + t[None, :] * stride_bcx + d[:, None], mask=x_mask, other=0.0)
        x_val = tl.load(bcx_ptr + t[None, :] * stride_bcx + 2 * dim + d[:, None], mask=x_mask, other=0.0)
        return window, (b_val * x_val).to(b_val.dtype), from_state

    @triton.jit
    def _gated_short_conv_varlen_kernel(
        bcx_ptr, w_ptr, bias_ptr, state_ptr, qsl_ptr, slots_ptr, initial_ptr, token_ptr, y_ptr,
        stride_bcx, stride_ws, stride_ss, stride_sd, stride_y, dim, state_len, lookahead,
        W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_INITIAL: tl.constexpr, GATHER: tl.constexpr,
        NULL_SLOT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        row = tl.program_id(0)
        block = tl.program_id(1)
        d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        d_ok = d < dim
        start = tl.load(qsl_ptr + row)
        q = tl.load(qsl_ptr + row + 1) - start
        slot = tl.load(slots_ptr + row).to(tl.int64)
        state_row = state_ptr + slot * stride_ss + d[:, None] * stride_sd

        # out[i] = bias + sum_j w[:, j] * ext[i + j]: ext position e < W-1 is window column e (zeros without an
        # initial state), else the gated input of the row's token e - (W-1)
        i = block * BLOCK_T + tl.arange(0, BLOCK_T)
        i_ok = i < q
        acc = tl.zeros([BLOCK_D, BLOCK_T], dtype=tl.float32)
        for j in tl.static_range(W):
            window, bx, from_state = _varlen_ext(i + j, i_ok, row, start, state_row, state_len, initial_ptr,
                                                 token_ptr, bcx_ptr, stride_bcx, dim, d, d_ok, W, HAS_INITIAL, GATHER)
            ext = tl.where(from_state[None, :], window.to(bx.dtype).to(tl.float32), bx.to(tl.float32))
            w = tl.load(w_ptr + d * stride_ws + j, mask=d_ok, other=0.0).to(bx.dtype).to(tl.float32)
            acc += w[:, None] * ext
        if HAS_BIAS:
            acc += tl.load(bias_ptr + d, mask=d_ok, other=0.0).to(tl.float32)[:, None]
        if GATHER:
            tokens = tl.load(token_ptr + start + i, mask=i_ok, other=0)
        else:
            tokens = start + i
        out_mask = d_ok[:, None] & i_ok[None, :]
        c_val = tl.load(bcx_ptr + tokens[None, :] * stride_bcx + dim + d[:, None], mask=out_mask, other=0.0)
        conv = acc.to(c_val.dtype)  # the conv output rounds to the activations' dtype before the gate
        y = (c_val * conv).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + tokens[None, :] * stride_y + d[:, None], y, mask=out_mask)

        # the row's first token block: state columns [0, W-1+L) = ext[q-L ..] (ext positions below 0 read
        # column 0, as the default path clamps them); every load before any store
        c = tl.arange(0, BLOCK_C)
        writes = (block == 0) & (q > 0) & (slot != NULL_SLOT)
        c_ok = (c < W - 1 + lookahead) & (c < state_len) & writes  # the default path writes no column past S
        window, bx, from_state = _varlen_ext(tl.maximum(q - lookahead + c, 0), c_ok, row, start, state_row, state_len,
                                             initial_ptr, token_ptr, bcx_ptr, stride_bcx, dim, d, d_ok, W, HAS_INITIAL,
                                             GATHER)
        # window columns pass through the activations' dtype, as the default path's concatenation does
        new = tl.where(from_state[None, :], window.to(bx.dtype), bx).to(window.dtype)
        tl.debug_barrier()
        tl.store(state_row + c[None, :], new, mask=d_ok[:, None] & c_ok[None, :])


def gated_short_conv_varlen(bcx: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            conv_state: torch.Tensor, query_start_loc: torch.Tensor, state_indices: torch.Tensor,
                            has_initial_state: torch.Tensor | None, state_lookahead: int,
                            token_indx: torch.Tensor | None) -> torch.Tensor:
    """c * causal_conv1d_varlen(b * x) over R non-spec rows, with (b, c, x) = bcx.chunk(3, dim=-1).

    bcx: [T, 3 * D] (in_proj's output); weight [D, W]; bias [D] or None; conv_state [num_slots, D, S]
    (S >= W-1+L, updated in place); query_start_loc int32[R + 1]: the rows' offsets among the N gathered tokens;
    state_indices int32[R] (NULL slot: computes, writes no state); has_initial_state bool[R] or None (all
    true); state_lookahead L >= 0; token_indx int64[N]: the flat token of each gathered one, or None (the rows'
    tokens are bcx's first ones, N = T). Returns [T, D] in bcx's dtype: every token outside the rows gets zeros.
    """
    num_tokens, dim = bcx.shape[0], bcx.shape[1] // 3
    num_rows = query_start_loc.numel() - 1
    gathered = token_indx.numel() if token_indx is not None else num_tokens
    width = weight.shape[1]
    weight = weight.contiguous()
    y = torch.zeros(num_tokens, dim, device=bcx.device, dtype=bcx.dtype)
    if num_rows == 0 or gathered == 0:
        return y
    block_t = max(TOKENS_PER_PROGRAM, triton.next_power_of_2(width))  # the first block holds every window read
    grid = (num_rows, triton.cdiv(gathered, block_t), triton.cdiv(dim, CHANNELS_PER_PROGRAM))
    _gated_short_conv_varlen_kernel[grid](
        bcx, weight, bias if bias is not None else weight, conv_state, query_start_loc, state_indices,
        has_initial_state if has_initial_state is not None else state_indices,
        token_indx if token_indx is not None else query_start_loc, y,
        bcx.stride(0), weight.stride(0), conv_state.stride(0), conv_state.stride(1), y.stride(0), dim,
        conv_state.shape[2], state_lookahead,
        W=width, HAS_BIAS=bias is not None, HAS_INITIAL=has_initial_state is not None, GATHER=token_indx is not None,
        NULL_SLOT=NULL_BLOCK_ID, BLOCK_D=CHANNELS_PER_PROGRAM, BLOCK_T=block_t,
        BLOCK_C=max(2, triton.next_power_of_2(width - 1 + state_lookahead)),
        num_warps=4,
    )
    return y
