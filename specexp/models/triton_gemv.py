"""A batch-1 GEMV in Triton: y[1, N] = x[1, K] @ W[N, K]^T (+ bias) (+ residual), fp32 accumulation, optionally
with the RMSNorm before it (a pre-norm projection) fused in; and a skinny-GEMM sibling for a few rows of x
(M = 2..MAX_TOKENS: a batch-1 verify of k+1 tokens, a draft prefill region of k+2) that streams each weight once
for all M rows.

At batch 1 every projection of a decode step streams its whole weight once for one row of activations, so the
step is bound by how close each GEMV gets to HBM bandwidth. On an H200 (2026-11-29,
benchmarks/diagnostics/gemv_bandwidth.py, bf16, the GEMVs of a Llama-3.2-1B-shaped target in one CUDA graph)
cuBLAS reaches 64-70% of the copy bandwidth, this kernel 84%: each program streams BLOCK_N whole weight rows in
BLOCK_K chunks and reduces once at the end.

Each output element is one dot product over K in a fixed order (per-lane partial sums over the chunks, then a
tree over the lanes), whatever N is: the result does not depend on which other rows are computed.

The RMSNorm before a pre-norm projection (`norm_weight`, `eps`) is fused in: each program sums the squares
of x as it streams it and scales its dot products by 1/rms(x) at the end, (W (x * g)) / rms(x), which is
W (rms_norm(x) * g) up to rounding. In half precision that skips eager's two roundings of the normalised input
(fp32 throughout: one rounding fewer), so fused and eager agree to rounding, not bit for bit.

The skinny kernel streams each weight once for all M rows on the tensor cores: a program owns BLOCK_N weight
rows and multiplies each [BLOCK_N, BLOCK_K] chunk by the [16, BLOCK_K] tile of x (rows past M masked to 0) into an
fp32 [16, BLOCK_N] accumulator, software-pipelined over num_stages chunks. Its weight traffic is the GEMV's; its
compute is free at these shapes, so its time is flat in M. Each output is one tensor-core dot product in a fixed
order whatever M is. With a fused norm, x * g is rounded to x's dtype before the product (eager rounds
rms_norm(x) * g).

Measured on an H200 (bf16, 2026-11-30; `benchmarks/diagnostics/gemv_bandwidth.py --skinny-tokens 2,4,10`): in
a chain of the projections alone (no norm fused) the kernel is flat in M and beat an `F.linear` + copy chain
(Llama-3.2-1B shape at M = 2 / 4 / 10: 0.849 / 0.856 / 0.863 ms against 0.926 / 0.931 / 0.941). Inside the
engine it first lost to cuBLAS: a LFM2-1.2B-shaped verify of 2 tokens spent 1.18 ms in 65 skinny kernels against
0.76 ms in cuBLAS's GEMMs (plus 0.06 ms of separate RMSNorms).

The fused norm was why. The kernel now sums each token's squares on the tensor cores too, as the diagonal of
x x^T accumulated over the chunks: summing them in registers needs x in a second layout every chunk, which cost
2.7x the unfused kernel's time (2.17 ms against 0.80 for the GEMMs of a LFM2-1.2B-shaped step at M = 2; 1.22 ms
on the tensor cores; H200, 2026-11-30). Scaling x by the norm weight cost another 15-25%, as x then leaves its
shared-memory pipeline for registers; with the weight folded into W (`rms_only`,
:mod:`specexp.models.norm_folding`) the kernel skips it. With both, a verify of 2-5 tokens takes 1.19-1.21
decode steps on the LFM2-1.2B shape and 1.13-1.15 on the Llama-3.2-1B shape, against 1.27 (LFM2-1.2B) on cuBLAS
plus separate norms (`experiments/2026-11-29-cudagraphs-h200/`), so `engine=cuda` runs `triton_skinny` with
folded norms.

A gated MLP's gate/up projection of 2-16 rows can also end in its SiLU product (:func:`gate_up_silu`,
`engine.silu_in_gate_up`): each program's tile interleaves gate rows with the matching up rows, so one product
gives both and its epilogue writes silu(gate) * up, [M, I], rounded step by step as eager's kernels round. On an
H100 it is what eager's kernels compute, bit for bit, at the 1B and draft shapes; it speeds a 1B target's verify
only with the skinny kernels launched in stream order (`engine.skinny_early_launch`,
`experiments/2026-12-06-verify-launch-order-h100/`).

A multi-row GEMV (one fp32 accumulator per row of x, each weight chunk loaded once) lost to cuBLAS at 2-4 rows on
every 1B-class shape even tuned (LFM2-1.2B shape at M = 2: 0.87 ms against 0.80) and was removed. At exactly two
rows it beat this skinny kernel in chains of products alone on an H100 (2026-12-06, every narrow product;
`experiments/2026-12-06-skinny-alternatives-h100/`), but inside the engine (this GEMV kernel with a second
accumulator, for two rows and outputs up to 8192 wide) it bought nothing measurable end to end: the draft's
two-slot prefill and its later steps took 0.79 ms a k = 4 step either way, 1.52 at k = 8 (Llama-1B-shaped pair,
synthetic 0.8, step medians; `experiments/2026-12-07-draft-catch-up-h100/`), so it was removed again. The GEMV
kernel itself can take a few rows, a program per (row, tile), which beat the skinny kernel at two rows on narrow
products in such chains (`experiments/2026-12-07-row-grid-h100/`) but made the engine's k = 1 verify longer
(`ROW_GRID_MAX_TOKENS`, off by default, `experiments/2026-12-08-in-engine-checks-h100/`).

Importable without Triton (`AVAILABLE` is then False); the kernel itself needs a CUDA device, or Triton's
interpreter (`TRITON_INTERPRET=1`) for CPU tensors.
"""

from __future__ import annotations

import torch

from specexp.models import skinny_configs
from specexp.models.triton_support import AVAILABLE, early_launch_flags, tl, triton, wait_for_earlier_kernels

# Tuned on the H200 over (BLOCK_N, BLOCK_K, warps) in {4, 8, 16, 32} x {256, 512, 1024} x {4, 8} and (2, 1024, 4)
# for every weight shape of both 1B-class targets: (2, 1024, 4) won on all of them.
BLOCK_N = 2
MAX_BLOCK_K = 1024
NUM_WARPS = 4
# Rows per program with the RMSNorm fused: each program re-reads x and the norm weight, which more rows amortise.
# Measured on the H200 in a Llama-3.2-1B-shaped step over 1, 2, 4, 8, 16 (the q/k/v and gate/up products): 8 won.
NORM_BLOCK_N = 8
# (BLOCK_N, largest BLOCK_K, num_warps) of an LM head's GEMV (64K-128K output rows; `linear_ops.norm_float_logits`,
# the model's final norm fused). On the H200 (2026-12-06, `experiments/2026-12-06-sweep-time-h200/gemv_bandwidth.json`,
# the plain GEMV over the grid above) (16, 256, 8) was the fastest tile on every head shape measured: Llama-3.2-1B's
# [128256, 2048] 0.131 ms against 0.146 for (2, 1024, 4), Llama-100M's [128256, 512] 0.039 against 0.072, LFM2-350M's
# [65536, 1024] 0.039 against 0.049. Sixteen rows a program also spread the norm's extra loads of x thin. (With
# NORM_BLOCK_N rows and 1024-wide chunks the fused head made the Llama-3.2-1B and LFM2-1.2B steps 0.02-0.04 ms longer
# on an H100, `experiments/2026-12-07-step-kernels-h100/`.)
HEAD_CONFIG = (16, 256, 8)
# Rows per program of the gated GEMV (the SiLU product computed in the down projection): each program recomputes
# silu(gate) * up from [gate, up] for its rows, which more rows amortise (as NORM_BLOCK_N; not tuned on a GPU).
GATED_BLOCK_N = 8
# Products of 2..ROW_GRID_MAX_TOKENS rows of x, with outputs up to ROW_GRID_MAX_N wide and inputs up to ROW_GRID_MAX_K,
# run on the GEMV kernel, one program per (row, tile of ROW_GRID_CONFIG's BLOCK_N outputs), not on the skinny
# kernel: a tile's rows run side by side (one reads the weight tile from memory, the other from L2), and a narrow
# product gets a program per row to keep loads in flight. Chains of each product alone at 2 rows, in stream order,
# on an H100 (2026-12-07, `experiments/2026-12-07-row-grid-h100/`, this tile): the
# Llama-3.2-1B target's q/k/v 0.113 ms against the skinny kernel's 0.133 (one row on the GEMV: 0.108), its o 0.097
# against 0.108; the Llama-100M draft's q/k/v 0.025 against 0.043, o 0.024 against 0.032, down 0.028 against
# 0.042, gate/up 0.053 against 0.052. The target's down (K = 8192: 0.254 against 0.240), its gate/up and LM head
# (wider) lost, as did every target product at 5 rows. Inside the engine (the same H100 kind, 2026-12-08,
# `experiments/2026-12-08-in-engine-checks-h100/`, Llama-1B-shaped pair, two pairs of runs) it lost: at 2 the k = 1
# verify took 0.06-0.07 ms longer and the draft's two-slot prefill, whose products launch early, gained nothing. So
# it is off (1); `benchmarks/gpu_cudagraphs.py --row-grid-max-tokens 2` turns it on for such an A/B.
ROW_GRID_MAX_TOKENS = 1
ROW_GRID_MAX_N = 4096
ROW_GRID_MAX_K = 4096
ROW_GRID_CONFIG = (8, 512, 4)
# Rows of x the skinny kernel takes (a verify of k + 1 <= 16 tokens, a draft prefill region of k + 2); more go to
# torch's GEMMs.
MAX_TOKENS = 16
TOKEN_TILE = 16  # rows of x per skinny tile (padded): tensor-core products take at least 16
# The skinny kernel's (BLOCK_N, BLOCK_K, num_warps, num_stages) by output width N, up to each bound. Tuned on the
# H200 (benchmarks/diagnostics/gemv_bandwidth.py --skinny-tokens 2,4,10; 2026-11-30) per weight shape of the four
# real-size targets and drafts over BLOCK_N 16/32/64 x BLOCK_K 128..1024 x 4/8 warps x 2..4 stages; the same
# shape won at 2, 4 and 10 rows. Wide outputs take wide, short tiles; narrow ones long chunks so that enough
# bytes are in flight per program.
SKINNY_CONFIGS_BY_N = ((2048, (16, 512, 4, 4)), (4096, (32, 512, 4, 4)), (None, (64, 128, 4, 4)))
# Shared memory the skinny kernel's pipeline stages may fill: each stage holds an x tile and a weight chunk. The
# tuned (16-bit) configurations need at most 192 KiB; 4-byte products drop stages to stay under this (the H200
# gives a block 227 KiB).
SKINNY_STAGE_BYTES = 192 * 1024


def skinny_config(n: int, k: int, element_bytes: int = 2) -> tuple[int, int, int, int]:
    """The skinny kernel's default (BLOCK_N, BLOCK_K, num_warps, num_stages) for a weight [n, k] of
    `element_bytes`-byte elements (SKINNY_CONFIGS_BY_N, its chunk no longer than k rounded up to a power of 2, and
    at least 16; fewer stages where the tuned ones would need more than SKINNY_STAGE_BYTES of shared memory)."""
    block_n, block_k, warps, stages = next(c for bound, c in SKINNY_CONFIGS_BY_N if bound is None or n <= bound)
    block_k = max(16, min(block_k, triton.next_power_of_2(k)))
    stage_bytes = (TOKEN_TILE + block_n) * block_k * element_bytes
    return block_n, block_k, warps, max(1, min(stages, SKINNY_STAGE_BYTES // stage_bytes))


def gate_up_config(n: int, k: int, element_bytes: int = 2) -> tuple[int, int, int, int]:
    """:func:`gate_up_silu`'s (gate rows a program takes, BLOCK_K, num_warps, num_stages) for a gate/up weight
    [n = 2I, k]: :func:`skinny_config`'s for that weight, a program's tile of rows holding half its rows from the
    gate and the matching ones from the up."""
    block_n, block_k, warps, stages = skinny_config(n, k, element_bytes)
    return block_n // 2, block_k, warps, stages


if AVAILABLE:

    @triton.jit
    def _gemv_x_chunk(x_ptr, norm_w_ptr, k, k_ok, K, SCALE: tl.constexpr, GATED: tl.constexpr):
        """fp32[BLOCK_K]: chunk k of x (of silu(gate) * up with GATED), before and after the norm weight's scaling
        (SCALE)."""
        if GATED:  # x = silu(gate) * up from [gate, up], each product rounded to x's dtype as eager rounds it
            gate = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            up = tl.load(x_ptr + K + k, mask=k_ok, other=0.0)
            silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(up.dtype).to(tl.float32)
            x = (silu * up.to(tl.float32)).to(up.dtype).to(tl.float32)
        else:
            x = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        scaled = x
        if SCALE:  # the norm's weight (not folded into W)
            scaled = x * tl.load(norm_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        return x, scaled


    @triton.jit
    def _gemv_kernel(x_ptr, norm_w_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y, eps,
                     HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NORM: tl.constexpr,
                     SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GATED: tl.constexpr = False, PREFETCH_W: tl.constexpr = False, GDC: tl.constexpr = False):
        # One program per (row of x, tile of BLOCK_N outputs), a tile's M rows side by side in launch order.
        token = tl.program_id(0) % M
        x_ptr += token * stride_x
        res_ptr += token * stride_y
        y_ptr += token * stride_y
        rows = (tl.program_id(0) // M) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        row_ok = rows < N
        w_rows = w_ptr + rows[:, None] * stride_w
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        if NORM:
            squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        if PREFETCH_W:  # each weight chunk loaded one chunk ahead; the first before waiting on the kernel before
            if GDC:
                tl.extra.cuda.gdc_launch_dependents()
            w_next = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)
            if GDC:  # no kernel writes the weights; x, the bias and the residual are read after this
                tl.extra.cuda.gdc_wait()
        for k0 in range(0, K, BLOCK_K):
            k = k0 + cols
            k_ok = k < K
            x, scaled = _gemv_x_chunk(x_ptr, norm_w_ptr, k, k_ok, K, SCALE, GATED)
            if NORM:  # the 1/rms scale is applied to the dot products at the end
                squares += x * x
            if PREFETCH_W:
                w = w_next
                k_ahead = k + BLOCK_K
                w_next = tl.load(w_rows + k_ahead[None, :], mask=row_ok[:, None] & (k_ahead < K)[None, :],
                                 other=0.0)
            else:
                w = tl.load(w_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            acc += w.to(tl.float32) * scaled[None, :]
        y = tl.sum(acc, axis=1)
        if NORM:
            y = y / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            y += tl.load(res_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        # rounded to x's dtype, then stored in y's (fp32 logits: the values a product in x's dtype casts to)
        tl.store(y_ptr + rows, y.to(x_ptr.dtype.element_ty).to(y_ptr.dtype.element_ty), mask=row_ok)


    @triton.jit
    def _tile_dot(a, b, acc, IEEE: tl.constexpr):
        """acc + a @ b on the tensor cores; fp32 operands (IEEE) in full precision, not TF32."""
        if IEEE:
            return tl.dot(a, b, acc, input_precision="ieee")
        return tl.dot(a, b, acc)


    @triton.jit
    def _rms_from_gram(gram, tokens, K, eps):
        """fp32[BLOCK_M]: each token's rms over K columns, from the diagonal of its accumulated x x^T (gram)."""
        squares = tl.sum(tl.where(tokens[:, None] == tokens[None, :], gram, 0.0), axis=1)
        return tl.sqrt(squares / K + eps)


    @triton.jit
    def _skinny_kernel(x_ptr, norm_w_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                       eps, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NORM: tl.constexpr,
                       SCALE: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GDC: tl.constexpr = False):
        wait_for_earlier_kernels(GDC)  # launched early: its pipeline loads weights and x together
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        tokens = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_K)
        row_ok = rows < N
        token_ok = tokens < M
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if NORM:  # each token's sum of squares is the diagonal of the x x^T accumulated here
            gram = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + cols
            k_ok = k < K
            x = tl.load(x_ptr + tokens[:, None] * stride_x + k[None, :], mask=token_ok[:, None] & k_ok[None, :],
                        other=0.0)
            if NORM:  # each token's 1/rms scale is applied to its dot products at the end
                gram = _tile_dot(x, tl.trans(x), gram, IEEE)
            if SCALE:  # the norm's weight (not folded into W): x goes through registers, off the pipeline
                x = (x.to(tl.float32) * tl.load(norm_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]).to(
                    x.dtype)
            w = tl.load(w_ptr + rows[:, None] * stride_w + k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            acc = _tile_dot(x, tl.trans(w), acc, IEEE)
        y = acc  # [BLOCK_M, BLOCK_N]
        if NORM:
            y = y / _rms_from_gram(gram, tokens, K, eps)[:, None]
        out_offsets = tokens[:, None] * stride_y + rows[None, :]
        out_ok = token_ok[:, None] & row_ok[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_RESIDUAL:
            y += tl.load(res_ptr + out_offsets, mask=out_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + out_offsets, y.to(x_ptr.dtype.element_ty).to(y_ptr.dtype.element_ty), mask=out_ok)


    @triton.jit
    def _skinny_gate_up_kernel(x_ptr, w_ptr, y_ptr, M, I, K, stride_x, stride_w, stride_y, eps,
                               NORM: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr = False):
        """y[:, rows] = silu(gate) * up for BLOCK_N gate rows and their up rows (I further) of W [2I, K]: one tile
        of 2 * BLOCK_N weight rows, gate and up rows interleaved, so one product gives both."""
        wait_for_earlier_kernels(GDC)  # launched early: its pipeline loads weights and x together
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        tile = tl.arange(0, 2 * BLOCK_N)
        tile_rows = tl.program_id(0) * BLOCK_N + tile // 2  # gate row r, then up row r
        tile_ok = tile_rows < I
        w_rows = w_ptr + (tile_rows + (tile % 2) * I)[:, None] * stride_w
        tokens = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_K)
        token_ok = tokens < M
        acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
        gram = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)  # with NORM, each token's sum of squares: its diagonal
        for k0 in range(0, K, BLOCK_K):
            k = k0 + cols
            k_ok = k < K
            x = tl.load(x_ptr + tokens[:, None] * stride_x + k[None, :], mask=token_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(w_rows + k[None, :], mask=tile_ok[:, None] & k_ok[None, :], other=0.0)
            if NORM:
                gram = _tile_dot(x, tl.trans(x), gram, IEEE)
            acc = _tile_dot(x, tl.trans(w), acc, IEEE)
        if NORM:
            acc = acc / _rms_from_gram(gram, tokens, K, eps)[:, None]
        gate, up = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
        dtype = x_ptr.dtype.element_ty
        # each step rounded to x's dtype as the unfused kernels round it: the projection's output, silu(gate),
        # and its product with up
        gate = gate.to(dtype).to(tl.float32)
        up = up.to(dtype).to(tl.float32)
        silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(dtype).to(tl.float32)
        out_offsets = tokens[:, None] * stride_y + rows[None, :]
        tl.store(y_ptr + out_offsets, (silu * up).to(dtype), mask=token_ok[:, None] & (rows < I)[None, :])


def _pdl_flags(pdl: bool, device: torch.device) -> dict:
    """The GEMV's flags for `pdl` (see :func:`gemv`): its weight prefetch wherever asked; the grid dependency
    control and the launch attribute only where the device has them."""
    return {"PREFETCH_W": pdl, **early_launch_flags(pdl, device)}


def _launch_gemv(x: torch.Tensor, norm_weight: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
                 residual: torch.Tensor | None, out: torch.Tensor, eps: float, config: tuple[int, ...],
                 *, normalize: bool = False, gated: bool = False, pdl: bool = False) -> torch.Tensor:
    """The GEMV kernel over weight [N, K] for each row of x into out [M, N] (the residual's storage when given):
    one program per (row, tile of outputs), a row's sums those of a one-row launch of the same config. x is [M, K]
    (rows contiguous), or [1, 2K] (gate then up) when `gated`. config: (BLOCK_N, BLOCK_K, num_warps[, num_stages]).
    Returns out."""
    n, k = weight.shape
    m = x.shape[0]
    block_n, block_k, warps, *stages = config
    options = {"num_warps": warps} | ({"num_stages": stages[0]} if stages else {})
    placeholder = x  # any pointer of x's type, for the operands a flag switches off
    _gemv_kernel[(m * triton.cdiv(n, block_n),)](
        x, norm_weight if norm_weight is not None else placeholder, weight,
        bias if bias is not None else placeholder, out, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        eps,
        HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, NORM=normalize,
        SCALE=norm_weight is not None, BLOCK_N=block_n, BLOCK_K=block_k, GATED=gated, **options,
        **_pdl_flags(pdl, x.device))
    return out


def gated_gemv(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, *, pdl: bool = False) -> torch.Tensor:
    """The down projection of a SiLU-gated MLP with its gate in the same kernel, for one token: gate_up [1, 2I]
    (gate then up, contiguous), weight [N, I] (rows contiguous), bias [N] or None -> (silu(gate) * up) @ weight^T
    + bias, [1, N] in gate_up's dtype; with `residual` ([1, N], contiguous) added to it in place and returned.
    pdl: as :func:`gemv`'s.

    silu(gate) and its product with up are each rounded to the dtype, as eager's two kernels round them; silu's
    exp is Triton's, so the product may differ from eager's in the last bit of a few elements. Saves the SiLU
    product's kernel (and its [1, I] round trip) in each layer of a batch-1 step."""
    if gate_up.dim() != 2 or gate_up.shape[0] != 1 or gate_up.shape[1] != 2 * weight.shape[1]:
        raise ValueError(f"triton_gemv.gated_gemv takes gate_up [1, 2 * {weight.shape[1]}] for weight "
                         f"{tuple(weight.shape)}, got {tuple(gate_up.shape)}")
    n, k = weight.shape
    out = residual if residual is not None else torch.empty(1, n, device=gate_up.device, dtype=gate_up.dtype)
    config = (GATED_BLOCK_N, min(MAX_BLOCK_K, triton.next_power_of_2(k)), NUM_WARPS)
    return _launch_gemv(gate_up.contiguous(), None, weight, bias, residual, out, 0.0, config, gated=True, pdl=pdl)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, *, rms_only: bool = False, eps: float = 0.0,
                 pdl: bool = False, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """A SiLU-gated MLP's gate and up projections and their SiLU product in one skinny kernel: x [M, K]
    (2 <= M <= MAX_TOKENS), weight [2I, K] (the gate's I rows, then the up's; rows contiguous) -> silu(x W_gate^T)
    * (x W_up^T), [M, I] in x's dtype; with `rms_only`, x is first RMS-normalised (a norm whose weight is folded into
    `weight`). pdl: as :func:`gemv`'s.

    The same products as :func:`gemv` over the whole [2I, K] weight (each program's tile of weight rows holds
    BLOCK_N gate rows interleaved with the matching up rows), each rounded to x's dtype, then silu(gate) and its
    product with up each rounded, as eager's SiLU and multiply round them (silu's exp is Triton's: a few elements
    may differ in the last bit). Saves the SiLU product's kernel and the [M, 2I] round trip in each layer of a
    verify. config: (gate rows a program takes, BLOCK_K, num_warps, num_stages), for tuning (None: the device's
    tuned tile for this weight shape, :mod:`specexp.models.skinny_configs`, else :func:`gate_up_config`)."""
    m, k = x.shape
    if weight.shape[0] % 2 or weight.shape[1] != k or not 2 <= m <= MAX_TOKENS:
        raise ValueError(f"triton_gemv.gate_up_silu takes x [2..{MAX_TOKENS}, K] and weight [2I, K], got x "
                         f"{tuple(x.shape)} and weight {tuple(weight.shape)}")
    width = weight.shape[0] // 2
    block_n, block_k, warps, stages = (
        config or skinny_configs.tuned_config(x.device, weight.shape[0], k, x.element_size(), "gate_up_silu")
        or gate_up_config(weight.shape[0], k, x.element_size()))
    x = x.contiguous()
    out = torch.empty(m, width, device=x.device, dtype=x.dtype)
    _skinny_gate_up_kernel[(triton.cdiv(width, block_n),)](
        x, weight, out, m, width, k, x.stride(0), weight.stride(0), out.stride(0), eps, NORM=rms_only,
        IEEE=x.dtype == torch.float32, BLOCK_M=TOKEN_TILE, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        num_stages=stages, **early_launch_flags(pdl, x.device))
    return out


def head_config(k: int) -> tuple[int, int, int]:
    """The GEMV's (BLOCK_N, BLOCK_K, num_warps) for an LM head of hidden size k (HEAD_CONFIG, its chunk no longer
    than k rounded up to a power of 2)."""
    block_n, block_k, warps = HEAD_CONFIG
    return block_n, min(block_k, triton.next_power_of_2(k)), warps


def supports(x: torch.Tensor, weight: torch.Tensor, *same_dtype: torch.Tensor, max_tokens: int = 1) -> bool:
    """Whether :func:`gemv` takes this product: 1..max_tokens (<= MAX_TOKENS) rows of x, Triton present, weight
    rows contiguous, and one dtype for x, weight and `same_dtype` (e.g. a norm weight)."""
    return (AVAILABLE and x.dim() == 2 and 1 <= x.shape[0] <= min(max_tokens, MAX_TOKENS)
            and weight.stride(1) == 1 and all(t.dtype == x.dtype for t in (weight, *same_dtype)))


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, config: tuple[int, ...] | None = None, *,
         norm_weight: torch.Tensor | None = None, eps: float = 0.0, rms_only: bool = False,
         out_dtype: torch.dtype | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M, K] (1 <= M <= MAX_TOKENS), weight [N, K] (rows contiguous), bias [N] or None -> a @ weight^T + bias,
    [M, N] in x's dtype (or `out_dtype`: rounded to x's dtype first, so fp32 logits hold the values that
    `.float()` of the product would, without its kernel), where a = x, or rms_norm(x) * norm_weight row by row with
    `norm_weight` [K] (and `eps`), or with `rms_only` (no norm_weight) rms_norm(x) alone: a norm whose weight is
    folded into `weight` (:mod:`specexp.models.norm_folding`), which spares the kernels the scaling of x.

    M = 1 runs the GEMV kernel; M >= 2 the skinny kernel, except products of up to ROW_GRID_MAX_TOKENS rows, N <=
    ROW_GRID_MAX_N and K <= ROW_GRID_MAX_K (without a `config`), which run the GEMV kernel a program per row and tile.
    Either way a row's values do not depend on the other rows. With `residual` ([M, N], contiguous) the sum is added to
    it in place and residual is returned: one rounding of (residual + product + bias), as `residual.addmm_` rounds.
    config: (BLOCK_N, BLOCK_K, num_warps[, num_stages]), for tuning (None: for M = 1, BLOCK_N rows per program,
    NORM_BLOCK_N with a norm, min(MAX_BLOCK_K, K rounded up to a power of 2) and NUM_WARPS; for M >= 2, the
    device's tuned tile for this weight shape (:mod:`specexp.models.skinny_configs`), else :func:`skinny_config`).

    pdl (`engine.programmatic_launch`): on a GPU of compute capability 9.0 or later, the kernel is launched with
    programmatic dependent launch. It may then start while the kernel before it on the stream is finishing: the
    GEMV loads its first weight chunk, then waits for the earlier kernels (weights are the only operand no kernel
    writes) and loads every later chunk one chunk ahead; the skinny kernel waits first thing. Each signals at its
    start that the kernel after it may launch. The weight must therefore not be written by the kernel launched
    just before (the engine's weights are written once, before any step). Elsewhere (an older GPU; CPU tensors
    under Triton's interpreter) the GEMV still loads its chunks one ahead, launched as usual. Same values either
    way: every sum is taken in the same order.
    """
    n, k = weight.shape
    m = x.shape[0]
    if residual is not None and out_dtype not in (None, residual.dtype):
        raise ValueError(f"triton_gemv.gemv: out_dtype {out_dtype} with a residual of {residual.dtype}")
    if rms_only and norm_weight is not None:
        raise ValueError("triton_gemv.gemv: rms_only normalises without a weight; got a norm_weight too")
    normalize = norm_weight is not None or rms_only
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"triton_gemv.gemv takes 1..{MAX_TOKENS} rows of x, got x of shape {tuple(x.shape)}")
    x = x.contiguous()
    out = residual if residual is not None else torch.empty(m, n, device=x.device, dtype=out_dtype or x.dtype)
    if m == 1:
        config = config or (NORM_BLOCK_N if normalize else BLOCK_N, min(MAX_BLOCK_K, triton.next_power_of_2(k)),
                            NUM_WARPS)
        return _launch_gemv(x, norm_weight, weight, bias, residual, out, eps, config, normalize=normalize,
                            pdl=pdl)
    if config is None and m <= ROW_GRID_MAX_TOKENS and n <= ROW_GRID_MAX_N and k <= ROW_GRID_MAX_K:
        return _launch_gemv(x, norm_weight, weight, bias, residual, out, eps, ROW_GRID_CONFIG, normalize=normalize,
                            pdl=pdl)
    block_n, block_k, warps, *stages = (config or skinny_configs.tuned_config(x.device, n, k, x.element_size())
                                        or skinny_config(n, k, x.element_size()))
    flags = {"HAS_BIAS": bias is not None, "HAS_RESIDUAL": residual is not None, "NORM": normalize,
             "SCALE": norm_weight is not None, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": warps}
    if stages:
        flags["num_stages"] = stages[0]
    _skinny_kernel[(triton.cdiv(n, block_n),)](
        x, norm_weight if norm_weight is not None else x, weight, bias if bias is not None else x, out, out, m, n, k,
        x.stride(0), weight.stride(0), out.stride(0), eps, IEEE=x.dtype == torch.float32, BLOCK_M=TOKEN_TILE,
        **flags, **early_launch_flags(pdl, x.device))  # its loads are pipelined by the compiler: no prefetch
    return out
