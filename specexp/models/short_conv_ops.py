"""Depthwise causal short convolution over a flattened varlen batch, with per-request conv-state slots.

Reference implementation in plain torch: no data-dependent shapes and no device-to-host reads, so the
same code runs on CPU and inside a CUDA graph. Notation (one request row r, kernel length W = L_cache):

    window  = W - 1 state columns read this step, starting at column `o` of the row's state slot
    ext     = window ++ x[0:q]            (q = query tokens of the row this step)
    out[i]  = bias + sum_j weight[:, j] * ext[i + j]        for i in [0, q), j in [0, W)

Non-speculative rows (prefill, plain decode) read the window at o = 0 (zeros if the row has no initial
state) and store the last W-1 entries of `ext` back at columns [0, W-1). With a lookahead of L trailing
inputs (a draft's prefill region ends with a token not yet committed), they store `ext[q-L : q+W-1]`
instead: the window ending at the last committed input at column 0, then the L lookahead inputs.

Speculative rows (verifying k drafts, q <= k + 1) read the window at o = num_accepted - 1 and store
`ext[1 : W-1+q]` at columns [0, W-2+q): one old column dropped, all q inputs appended. The next step's
num_accepted (accepted drafts + 1) then selects the window that ends exactly at the last accepted input,
so rejected tokens are rolled back without copying. The state therefore needs (W-1) + k columns.

Other batches (prefill chunks, mixed and ragged steps) take the varlen path: each row's window columns and the
step's inputs are stacked into one table, and every tap and every state column is a row of it, found by
indices (:class:`VarlenIndices`) that depend on the step's metadata alone. One forward's conv layers derive them
once (:class:`ConvPlan`), so a layer costs a gather, W multiply-adds and one state write. These batches run
eagerly, where each op is host time: an LFM2 prefill step went from 685 to 410 ops (tiny-lfm2, 5 conv layers).

Uniform pure-spec batches — every full-graph step (target verify of k+1 tokens a row, draft prefill of k+2,
draft decode of 1) — take a dense path: `x` viewed as [R, q, D], ext built per row, W shifted
multiply-adds, one state write: a handful of kernels per layer instead of the varlen gathers.

Rows whose slot is NULL_BLOCK_ID (padding) read slot 0 and never change it; rows with no tokens change no
state whatever their slot. Values a row must not use — a new request's stale slot, inputs past the last
real token — are dropped with selects, never multiplied by zero, so even NaN garbage cannot leak in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specexp.models import triton_short_conv
from specexp.models.kernels import UniformKernel, set_on_modules
from specexp.models.metadata import NULL_BLOCK_ID, SegmentedPlan, ShortConvMetadata


def _token_rows(query_start_loc: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row index, in-row index and validity of each of `num_tokens` flat tokens.

    query_start_loc: int32[R + 1]. Returns (row int64[N], index_in_row int64[N], valid bool[N]); tokens past
    query_start_loc[-1] (graph padding) are invalid and point at the last row.
    """
    num_rows = query_start_loc.numel() - 1
    qsl = query_start_loc.to(torch.int64)
    tokens = torch.arange(num_tokens, device=qsl.device)
    row = torch.searchsorted(qsl[1:], tokens, right=True).clamp_(max=max(num_rows - 1, 0))
    valid = tokens < qsl[-1]
    return row, tokens - qsl[row], valid


def window_columns(offsets: torch.Tensor, width: int, state_len: int) -> torch.Tensor:
    """int64[R, W-1]: the state columns offsets[r] .. offsets[r] + W-2 of each row's window, clamped into [0, S)."""
    cols = offsets.to(torch.int64).unsqueeze(1) + torch.arange(width - 1, device=offsets.device)
    return cols.clamp(0, state_len - 1)


@dataclass(frozen=True)
class VarlenIndices:
    """Where the varlen paths read and write, derived from a step's metadata alone, so one forward's conv
    layers share them (:class:`ConvPlan`). Everything indexes `ext`, the rows' read windows then the step's
    inputs stacked as one table: ext = [window columns of row 0, of row 1, ..., x[0], ..., x[N-1]] ([R*(W-1) + N,
    D]), so each row's ext_r (window ++ its inputs) is a set of table rows.

    slots int64[R]: each row's state slot; window_cols int64[R, W-1]: the state columns its window reads;
    conv_index int64[N, W]: ext rows of token t's taps (ext_r[i + j]); valid bool[N, 1]: real (non-padding)
    tokens; write_index int64[R, S]: the ext row each state column would take; write_mask bool[R, 1, S]: the
    columns a row writes (its own slot, not NULL).
    """

    slots: torch.Tensor
    window_cols: torch.Tensor
    conv_index: torch.Tensor
    valid: torch.Tensor
    write_index: torch.Tensor
    write_mask: torch.Tensor


def seed_scratch_windows(conv_states: torch.Tensor, slots: torch.Tensor, scratch_slots: torch.Tensor,
                         offsets: torch.Tensor, width: int) -> None:
    """conv_states[:, scratch, :, 0:W-1] = conv_states[:, slot, :, o : o+W-1] per row, for every conv layer at
    once (device, no sync).

    conv_states: [L, num_slots, D, S] (all layers' states, stacked); slots, scratch_slots: int64[R];
    offsets: int64[R] (the window start in the real slot)."""
    num_layers, _, dim, state_len = conv_states.shape
    cols = window_columns(offsets, width, state_len)
    src = conv_states[:, slots]  # [L, R, D, S]
    index = cols.view(1, -1, 1, width - 1).expand(num_layers, -1, dim, -1)
    conv_states[:, scratch_slots, :, : width - 1] = torch.gather(src, 3, index)


def varlen_indices(query_start_loc: torch.Tensor, state_indices: torch.Tensor, window_offsets: torch.Tensor,
                   first_ext_index: torch.Tensor, num_cols: torch.Tensor, num_tokens: int, width: int,
                   state_len: int) -> VarlenIndices:
    """:class:`VarlenIndices` of rows laid out by query_start_loc int32[R + 1] over `num_tokens` (N) inputs,
    for conv width W and state length S. Per row [R]: its slot (state_indices), the first state column its
    window reads (window_offsets), and the write, state column c <- ext_r[first_ext_index + c] for
    c < num_cols (int tensors)."""
    num_rows = query_start_loc.numel() - 1
    window = width - 1
    device = query_start_loc.device
    qsl = query_start_loc.to(torch.int64)
    slots = state_indices.to(torch.int64)
    window_cols = window_columns(window_offsets, width, state_len)
    table_rows = max(num_rows * window + num_tokens - 1, 0)

    def ext_rows(row_start: torch.Tensor, row: torch.Tensor, ext_index: torch.Tensor) -> torch.Tensor:
        # ext_r[e]: window column e (e < W-1, clamped into the window) or input row_start + e - (W-1)
        from_x = num_rows * window + (row_start + ext_index - window).clamp(0, max(num_tokens - 1, 0))
        from_window = row * window + ext_index.clamp(min=0, max=max(window - 1, 0))
        return torch.where(ext_index >= window, from_x, from_window).clamp(0, table_rows)

    row, index_in_row, valid = _token_rows(query_start_loc, num_tokens)
    conv_ext = index_in_row.unsqueeze(1) + torch.arange(width, device=device)  # [N, W]
    conv_index = ext_rows(qsl[row].unsqueeze(1), row.unsqueeze(1), conv_ext)
    cols = torch.arange(state_len, device=device)
    write_ext = first_ext_index.to(torch.int64).unsqueeze(1) + cols  # [R, S]
    write_index = ext_rows(qsl[:-1].unsqueeze(1), torch.arange(num_rows, device=device).unsqueeze(1), write_ext)
    write = (cols < num_cols.to(torch.int64).unsqueeze(1)) & (slots != NULL_BLOCK_ID).unsqueeze(1)
    if window == 0:  # no window to read columns before ext from: such columns keep their values
        write = write & (write_ext >= 0)
    return VarlenIndices(slots, window_cols, conv_index, valid.unsqueeze(1), write_index, write.unsqueeze(1))


def _varlen_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    indices: VarlenIndices,
    has_initial_state: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[t] = bias + sum_j weight[:, j] * ext_r[i + j] for each flat token t (row r, in-row index i), then each
    row's state columns rewritten as `indices` says. x: [N, D]; weight: [D, W]; has_initial_state: bool[R] or
    None (False: the row's window reads zeros). Returns [N, D]; padding tokens get zeros."""
    num_tokens, dim = x.shape
    width = weight.shape[1]
    if num_tokens == 0:  # no row has inputs: nothing to compute, no column to write
        return torch.zeros_like(x)
    old = conv_state[indices.slots]  # [R, D, S]
    ext = x
    if width > 1:
        windows = torch.gather(old, 2, indices.window_cols.unsqueeze(1).expand(-1, dim, -1))  # [R, D, W-1]
        if has_initial_state is not None:
            # Select, not multiply: a slot handed to a new request holds stale (even non-finite) values.
            windows = torch.where(has_initial_state.view(-1, 1, 1), windows, torch.zeros_like(windows))
        ext = torch.cat([windows.transpose(1, 2).reshape(-1, dim), x])
    taps = ext[indices.conv_index]  # [N, W, D]
    out = torch.zeros_like(x) if bias is None else bias.to(x.dtype).expand(num_tokens, dim).clone()
    for j in range(width):
        out = out + weight[:, j].to(x.dtype) * taps[:, j]
    # A select, not a product: padded inputs may hold anything (NaN included) and must still give zeros.
    out = torch.where(indices.valid, out, torch.zeros_like(out))
    value = ext[indices.write_index].permute(0, 2, 1)  # [R, D, S]
    conv_state.index_copy_(0, indices.slots, torch.where(indices.write_mask, value.to(old.dtype), old))
    return out


def non_spec_indices(query_start_loc: torch.Tensor, state_indices: torch.Tensor, num_tokens: int, width: int,
                     state_len: int, state_lookahead: int = 0) -> VarlenIndices:
    """:class:`VarlenIndices` of :func:`causal_conv1d_varlen`'s rows (their docstring says what they read and
    keep)."""
    qsl = query_start_loc.to(torch.int64)
    query_lens = qsl[1:] - qsl[:-1]
    # Rows with no tokens (padding) keep their state: write zero columns.
    num_cols = torch.where(query_lens > 0, width - 1 + state_lookahead, 0)
    return varlen_indices(query_start_loc, state_indices, torch.zeros_like(query_lens), query_lens - state_lookahead,
                          num_cols, num_tokens, width, state_len)


def spec_indices(query_start_loc: torch.Tensor, state_indices: torch.Tensor, num_accepted_tokens: torch.Tensor,
                 num_tokens: int, width: int, state_len: int) -> VarlenIndices:
    """:class:`VarlenIndices` of :func:`causal_conv1d_spec_update`'s rows (their docstring says what they read
    and keep)."""
    qsl = query_start_loc.to(torch.int64)
    query_lens = qsl[1:] - qsl[:-1]
    # Rows with no tokens (graph padding) keep their state: dropping a column without appending one would
    # shift the window the next step reads.
    num_cols = torch.where(query_lens > 0, query_lens + (width - 2), 0)
    return varlen_indices(query_start_loc, state_indices, num_accepted_tokens.to(torch.int64) - 1,
                          torch.ones_like(query_lens), num_cols, num_tokens, width, state_len)


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    state_lookahead: int = 0,
    indices: VarlenIndices | None = None,
) -> torch.Tensor:
    """Non-speculative short conv (prefill chunks and single-token decodes) over a varlen batch.

    x: [N, D] inputs (B * x gate product), rows laid out by query_start_loc int32[R + 1];
    weight: [D, W]; bias: [D] or None; conv_state: [num_slots, D, S >= W-1], updated in place;
    state_indices: int32[R]; has_initial_state: bool[R] (False = start from zeros).
    state_lookahead: L >= 0 trailing inputs per row not committed yet (needs S >= W-1+L).
    Returns [N, D]. Each row's state ends as ext[q-L : q+W-1] (the window ending at its last committed input,
    then the L lookahead inputs), at columns [0, W-1+L).
    """
    if indices is None:
        indices = non_spec_indices(query_start_loc, state_indices, x.shape[0], weight.shape[1], conv_state.shape[2],
                                   state_lookahead)
    return _varlen_conv(x, weight, bias, conv_state, indices, has_initial_state)


def causal_conv1d_spec_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    indices: VarlenIndices | None = None,
) -> torch.Tensor:
    """Speculative short conv: each row verifies q <= k + 1 tokens starting from its accepted window.

    x: [N, D]; query_start_loc: int32[R + 1] (padded rows: zero-length, flat tail); state_indices: int32[R];
    num_accepted_tokens: int32[R] (>= 1) — the window read starts at column num_accepted - 1;
    conv_state: [num_slots, D, S] with S >= W-2+q for every row (S = W-1+k), updated in place: columns
    [0, W-2+q) become ext[1 : W-1+q]. Returns [N, D].
    """
    if indices is None:
        indices = spec_indices(query_start_loc, state_indices, num_accepted_tokens, x.shape[0], weight.shape[1],
                               conv_state.shape[2])
    return _varlen_conv(x, weight, bias, conv_state, indices)


def conv_taps(ext: torch.Tensor, weight: torch.Tensor, query_len: int) -> torch.Tensor:
    """out[r, :, i] = sum_j weight[:, j] * ext[r, :, i + j] for i < q: W shifted multiply-adds, in order.

    ext: [R, D, W-1+q]; weight: [D, W] in ext's dtype; returns [R, D, q]. (W = L_cache is 3 or 4: cheap
    everywhere, where a depthwise conv1d is slow on CPU backends.)
    """
    out = ext[:, :, 0:query_len] * weight[:, 0:1]
    for j in range(1, weight.shape[1]):
        out = out + ext[:, :, j : j + query_len] * weight[:, j : j + 1]
    return out


class ConvPlan:
    """Per-forward cache of what every short-conv layer derives from the step's metadata alone (the uniform
    path's slots, window columns and padding mask; the varlen paths' :class:`VarlenIndices`), so the first conv
    layer of a forward computes it and the others reuse it. Each model forward builds a fresh plan (as
    `AttentionPlan`): a captured graph recomputes it from the persistent metadata at every replay, and no plan
    outlives its step."""

    def __init__(self, meta: ShortConvMetadata) -> None:
        self.meta = meta
        self._memo: dict[tuple, object] = {}  # by (builder, its shape arguments)

    def _derived(self, build, *shape: int):
        """build(meta, *shape), once per forward for each builder and shape."""
        key = (build, *shape)
        if key not in self._memo:
            self._memo[key] = build(self.meta, *shape)
        return self._memo[key]

    def spec_indices(self, width: int, state_len: int, num_tokens: int) -> VarlenIndices:
        """:func:`spec_indices` of this step's spec rows over their `num_tokens` inputs."""
        return self._derived(_plan_spec_indices, width, state_len, num_tokens)

    def non_spec_indices(self, width: int, state_len: int, num_tokens: int) -> VarlenIndices:
        """:func:`non_spec_indices` of this step's prefill and decode rows over their `num_tokens` inputs."""
        return self._derived(_plan_non_spec_indices, width, state_len, num_tokens)

    def uniform_indices(self, width: int, state_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`uniform_indices` of this step's spec rows, for conv width W and state length S."""
        return self._derived(_plan_uniform_indices, width, state_len)

    def has_initial_non_spec(self) -> torch.Tensor | None:
        """`meta.has_initial_states_non_spec()` (bool[n_ns] or None), concatenated once per forward."""
        return self._derived(ShortConvMetadata.has_initial_states_non_spec)


def _plan_spec_indices(m: ShortConvMetadata, width: int, state_len: int, num_tokens: int) -> VarlenIndices:
    return spec_indices(m.spec_query_start_loc, m.spec_state_indices_tensor, m.num_accepted_tokens, num_tokens,
                        width, state_len)


def _plan_non_spec_indices(m: ShortConvMetadata, width: int, state_len: int, num_tokens: int) -> VarlenIndices:
    return non_spec_indices(m.non_spec_query_start_loc, m.state_indices_tensor, num_tokens, width, state_len,
                            m.non_spec_state_lookahead)


def _plan_uniform_indices(m: ShortConvMetadata, width: int, state_len: int
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return uniform_indices(m.spec_state_indices_tensor, m.num_accepted_tokens, m.num_spec_decodes, width, state_len)


def uniform_indices(state_indices: torch.Tensor, num_accepted_tokens: torch.Tensor, num_rows: int, width: int,
                    state_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the first R = num_rows rows: (slots int64[R], window columns int64[R, W-1] — num_accepted - 1 ..
    num_accepted + W - 3, clamped into [0, S) — and padded bool[R, 1, 1], true for NULL-slot rows)."""
    slots = state_indices[:num_rows].to(torch.int64)
    cols = window_columns(num_accepted_tokens[:num_rows].to(torch.int64) - 1, width, state_len)
    return slots, cols, (slots == NULL_BLOCK_ID).view(-1, 1, 1)


def causal_conv1d_spec_update_uniform(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    query_len: int,
    num_rows: int,
    indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    taps=conv_taps,
) -> torch.Tensor:
    """`causal_conv1d_spec_update` for the first `num_rows` (R) rows, of exactly `query_len` (q) tokens
    each, laid out row after row in x[:R*q] (the same results, dense shapes).

    x: [N >= R*q, D]; state_indices, num_accepted_tokens: int32[>= R] (rows past R: padding, untouched);
    conv_state [num_slots, D, S >= W-2+q]. indices: :func:`uniform_indices` of these rows, precomputed (a
    forward's :class:`ConvPlan`), else computed here. taps: :func:`conv_taps` or a fused equivalent.
    Returns [N, D]: tokens past R*q and the tokens of NULL-slot rows (graph padding captured as rows) get
    zeros, and NULL-slot rows leave every state untouched.
    """
    width = weight.shape[1]
    num_tokens, dim = x.shape
    if num_rows == 0:
        return torch.zeros_like(x)
    if indices is None:
        indices = uniform_indices(state_indices, num_accepted_tokens, num_rows, width, conv_state.shape[2])
    slots, cols, padded = indices
    states = conv_state[slots]  # [R, D, S]
    windows = torch.gather(states, 2, cols.unsqueeze(1).expand(-1, dim, -1))
    ext = torch.cat([windows.to(x.dtype), x[: num_rows * query_len].view(num_rows, query_len, dim).transpose(1, 2)],
                    dim=2)  # [R, D, W-1+q]
    out = taps(ext, weight.to(x.dtype), query_len)
    if bias is not None:
        out = out + bias.to(x.dtype).view(1, dim, 1)
    written = width - 2 + query_len
    new = torch.cat([ext[:, :, 1:].to(states.dtype), states[:, :, written:]], dim=2)
    conv_state.index_copy_(0, slots, torch.where(padded, states, new))
    out = torch.where(padded, torch.zeros((), dtype=out.dtype, device=out.device), out)  # padded tokens: zeros
    out = out.transpose(1, 2).reshape(num_rows * query_len, dim)
    if num_tokens > out.shape[0]:
        out = torch.cat([out, x.new_zeros(num_tokens - out.shape[0], dim)])
    return out


def uniform_spec_query_len(meta: ShortConvMetadata) -> int | None:
    """q when the batch is spec rows only, each verifying exactly q = spec_query_len tokens in batch order
    (every full-graph batch), else None. CPU ints only."""
    rows = meta.num_spec_decodes
    if rows == 0 or meta.num_decodes + meta.num_prefills > 0 or meta.spec_token_indx is not None:
        return None
    return meta.spec_query_len if meta.num_spec_decode_tokens == rows * meta.spec_query_len else None


# How short-conv layers run uniform batches and batches of non-spec rows (`engine.conv_kernel`): the default torch
# path, or the whole gated conv (b * x, the taps, c * out, the state update) in one Triton kernel per layer.
TORCH_CONV = UniformKernel("torch", None)
TRITON_CONV = UniformKernel("triton", triton_short_conv.gated_short_conv_uniform,
                            triton_short_conv.gated_short_conv_varlen)
CONV_KERNELS = {kernel.name: kernel for kernel in (TORCH_CONV, TRITON_CONV)}


def use_conv_kernel(model: nn.Module, kernel: UniformKernel) -> None:
    """Make every short-conv module of `model` (those with a `conv_kernel`) run with `kernel`."""
    set_on_modules(model, "conv_kernel", kernel)


def gated_short_conv(
    bcx: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    meta: ShortConvMetadata | ConvPlan,
    taps=conv_taps,
    kernel: UniformKernel = TORCH_CONV,
) -> torch.Tensor:
    """LFM2's gated short conv, c * short_conv(b * x) with (b, c, x) = bcx.chunk(3, dim=-1), over a whole step.

    bcx: [T, 3 * D] (in_proj's output); the rest as :func:`short_conv`. On the GPU a uniform batch runs on
    `kernel.uniform` and a batch of non-spec rows alone (prompt chunks) on `kernel.varlen`, where the kernel has
    one and supports the layer; every other batch on :func:`short_conv`. Returns [T, D].
    A `SegmentedPlan` runs each segment's tokens with its own plan (`specexp.models.segments`).
    """
    if isinstance(meta, SegmentedPlan):
        return torch.cat([gated_short_conv(bcx[a:b], weight, bias, conv_state, plan, taps, kernel)
                          for a, b, plan in meta.parts])
    plan = meta if isinstance(meta, ConvPlan) else ConvPlan(meta)
    m = plan.meta
    on_kernel = bcx.is_cuda and triton_short_conv.supports(bcx, conv_state)
    uniform_len = uniform_spec_query_len(m)
    if kernel.uniform is not None and uniform_len is not None and on_kernel:
        return kernel.uniform(bcx, weight, bias, conv_state, m.spec_state_indices_tensor, m.num_accepted_tokens,
                              uniform_len, m.num_spec_decodes)
    if kernel.varlen is not None and m.num_spec_decodes == 0 and m.num_non_spec_rows > 0 and on_kernel:
        return kernel.varlen(bcx, weight, bias, conv_state, m.non_spec_query_start_loc, m.state_indices_tensor,
                             plan.has_initial_non_spec(), m.non_spec_state_lookahead, m.non_spec_token_indx)
    b, c, x = bcx.chunk(3, dim=-1)
    return c * short_conv(b * x, weight, bias, conv_state, plan, taps)


def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    meta: ShortConvMetadata | ConvPlan,
    taps=conv_taps,
) -> torch.Tensor:
    """Apply the short conv of one layer to a whole step's batch, routing spec and non-spec rows.

    x: [T, D] (T may include graph padding past meta.num_actual_tokens); weight [D, W]; conv_state
    [num_slots, D, S]; meta: the step's metadata, or the forward's ConvPlan (shared by its conv layers);
    taps: the uniform (graph) path's multiply-adds, :func:`conv_taps` or a fused equivalent.
    Returns [T, D]; padded tokens get zeros.
    """
    plan = meta if isinstance(meta, ConvPlan) else ConvPlan(meta)
    meta = plan.meta
    num_spec_tokens = meta.num_spec_decode_tokens
    has_spec = meta.num_spec_decodes > 0
    has_non_spec = meta.num_decodes + meta.num_prefills > 0
    if not has_spec and not has_non_spec:  # empty step (or graph padding only): nothing reads or writes state
        return torch.zeros_like(x)
    uniform_len = uniform_spec_query_len(meta)
    if uniform_len is not None:
        return causal_conv1d_spec_update_uniform(
            x, weight, bias, conv_state, meta.spec_state_indices_tensor, meta.num_accepted_tokens, uniform_len,
            meta.num_spec_decodes, plan.uniform_indices(weight.shape[1], conv_state.shape[2]), taps,
        )
    width, state_len = weight.shape[1], conv_state.shape[2]
    if has_spec and not has_non_spec and meta.spec_token_indx is None:
        return causal_conv1d_spec_update(
            x, weight, bias, conv_state, meta.spec_query_start_loc, meta.spec_state_indices_tensor,
            meta.num_accepted_tokens, plan.spec_indices(width, state_len, x.shape[0]),
        )
    if not has_spec and meta.non_spec_token_indx is None:
        return causal_conv1d_varlen(
            x, weight, bias, conv_state, meta.non_spec_query_start_loc, meta.state_indices_tensor,
            plan.has_initial_non_spec(), meta.non_spec_state_lookahead,
            plan.non_spec_indices(width, state_len, x.shape[0]),
        )
    out = torch.zeros_like(x)
    if has_spec:
        spec_idx = meta.spec_token_indx[:num_spec_tokens]
        out[spec_idx] = causal_conv1d_spec_update(
            x[spec_idx], weight, bias, conv_state, meta.spec_query_start_loc, meta.spec_state_indices_tensor,
            meta.num_accepted_tokens, plan.spec_indices(width, state_len, num_spec_tokens),
        )
    if has_non_spec:
        ns_idx = meta.non_spec_token_indx
        out[ns_idx] = causal_conv1d_varlen(
            x[ns_idx], weight, bias, conv_state, meta.non_spec_query_start_loc, meta.state_indices_tensor,
            plan.has_initial_non_spec(), meta.non_spec_state_lookahead,
            plan.non_spec_indices(width, state_len, ns_idx.numel()),
        )
    return out
