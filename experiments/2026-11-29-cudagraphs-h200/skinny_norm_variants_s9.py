"""Session 9 experiment (H200): which part of the skinny GEMM's fused RMSNorm costs the time?

A copy of `specexp.models.triton_gemv._skinny_kernel` as it was before 2a245bc (no bias, no residual), with
switches that turn each part of the fused norm on or off, timed as the chain of every GEMM weight of a model in
one CUDA graph (as `benchmarks/gemv_bandwidth.py` times it) at M = 2 and 4 rows. The variants named "full ..."
and "squares by dot + g ..." compute the normed product; the others time one part alone.

    OUT=. PYTHONPATH=.:benchmarks python experiments/2026-11-29-cudagraphs-h200/skinny_norm_variants_s9.py \
        lfm2-1.2b,lfm2-350m,llama-3.2-1b [a|b]

Variant set a ran first (skinny_norm_variants_a_s9.json), set b second (skinny_norm_variants_b_s9.json).
"""

import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from gemv_bandwidth import ZOO, gemm_weights, graph_ms

from specexp.models import load_model
from specexp.models import triton_gemv as tg


@triton.jit
def skinny_variant(x_ptr, g_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y, eps,
                   SQ: tl.constexpr, SQ_TILE: tl.constexpr, SQ_DOT: tl.constexpr, G: tl.constexpr,
                   G_NEXT: tl.constexpr, CAST: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tokens = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    row_ok = rows < N
    token_ok = tokens < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    sq_tile = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    gram = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
    g = tl.load(g_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + cols
        k_ok = k < K
        x = tl.load(x_ptr + tokens[:, None] * stride_x + k[None, :], mask=token_ok[:, None] & k_ok[None, :],
                    other=0.0)
        if SQ_DOT:  # squares on the tensor cores: the diagonal of x x^T
            gram = tl.dot(x, tl.trans(x), gram)
        if CAST:
            xf = x.to(tl.float32)
            if SQ:  # squares in registers
                if SQ_TILE:
                    sq_tile += xf * xf
                else:
                    squares += tl.sum(xf * xf, axis=1)
            if G_NEXT:  # the norm weight loaded one chunk ahead
                g_next = tl.load(g_ptr + BLOCK_K + k, mask=BLOCK_K + k < K, other=0.0).to(tl.float32)
                xf = xf * g[None, :]
                g = g_next
            if G:
                xf = xf * tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            x = xf.to(w_ptr.dtype.element_ty)
        w = tl.load(w_ptr + rows[:, None] * stride_w + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    if SQ_TILE:
        squares = tl.sum(sq_tile, axis=1)
    if SQ_DOT:
        squares = tl.sum(tl.where(tokens[:, None] == tokens[None, :], gram, 0.0), axis=1)
    y = acc / tl.sqrt(squares / K + eps)[:, None]
    tl.store(y_ptr + tokens[:, None] * stride_y + rows[None, :], y.to(y_ptr.dtype.element_ty),
             mask=token_ok[:, None] & row_ok[None, :])


OFF = {"SQ": False, "SQ_TILE": False, "SQ_DOT": False, "G": False, "G_NEXT": False, "CAST": False}
VARIANT_SETS = {
    "a": {"plain (no norm work)": OFF,
          "cast only": {**OFF, "CAST": True},
          "g only": {**OFF, "CAST": True, "G": True},
          "squares (reduce per chunk) only": {**OFF, "CAST": True, "SQ": True},
          "squares (tile) only": {**OFF, "CAST": True, "SQ": True, "SQ_TILE": True},
          "full (reduce per chunk)": {**OFF, "CAST": True, "SQ": True, "G": True},
          "full (squares tile)": {**OFF, "CAST": True, "SQ": True, "SQ_TILE": True, "G": True}},
    "b": {"plain (no norm work)": OFF,
          "g only": {**OFF, "CAST": True, "G": True},
          "g prefetched only": {**OFF, "CAST": True, "G_NEXT": True},
          "squares by dot only": {**OFF, "SQ_DOT": True},
          "squares by dot + g": {**OFF, "SQ_DOT": True, "CAST": True, "G": True},
          "squares by dot + g prefetched": {**OFF, "SQ_DOT": True, "CAST": True, "G_NEXT": True},
          "full (reduce per chunk)": {**OFF, "CAST": True, "SQ": True, "G": True}},
}


def chain(weights, m, flags):
    xs = [torch.randn(m, w.shape[1], device="cuda", dtype=w.dtype) for w in weights]
    gs = [torch.rand(w.shape[1], device="cuda", dtype=w.dtype) for w in weights]
    ys = [torch.empty(m, w.shape[0], device="cuda", dtype=w.dtype) for w in weights]

    def body():
        for w, x, g, y in zip(weights, xs, gs, ys, strict=True):
            n, k = w.shape
            block_n, block_k, warps, stages = tg.skinny_config(n, k)
            skinny_variant[(triton.cdiv(n, block_n),)](
                x, g, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0), 1e-5, BLOCK_M=tg.TOKEN_TILE,
                BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages, **flags)

    return body


def main() -> None:
    variants = VARIANT_SETS[sys.argv[2] if len(sys.argv) > 2 else "b"]
    out = {}
    for name in sys.argv[1].split(","):
        model = load_model(ZOO / f"configs/{name}", dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
        weights = gemm_weights(model)
        for m in (2, 4):
            for label, flags in variants.items():
                out[f"{name} M={m} {label}"] = ms = graph_ms(chain(weights, m, flags))
                print(f"{name} M={m} {label}: {ms:.3f} ms", flush=True)
        del model, weights
        torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "."), "skinny_norm_variants_s9.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
