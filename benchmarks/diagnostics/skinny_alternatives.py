"""Three alternatives to the skinny kernel for a verify's products of 2-16 tokens, timed against it (GPU; torch +
triton only).

A batch-1 verify of k + 1 tokens streams every weight once, as a decode step does, but costs 1.08-1.10 plain steps
on the Llama-3.2-1B shape (`verify_cost.py`). Per weight shape, this script replays a chain of products (`count`
distinct weights of one shape, as in the model: no L2 reuse) inside one CUDA graph and reports ms per replay and the
fraction of the device's copy bandwidth, for:

  * `gemv_m1_ms`: the engine's one-row GEMV (`triton_gemv.gemv`, one token): what a plain decode step pays;
  * `skinny_ms`: the engine's skinny kernel (`triton_gemv.gemv`, M tokens): what a verify pays;
  * `--section split_k`: the skinny product with K split over SPLIT programs per tile of output rows, each writing
    fp32 partial sums; the last program of a tile to finish (an atomic count) adds them in a fixed order, applies
    the norm and residual and stores (same values on every run; no second kernel). More programs for the narrow
    products (N = 2048 gives 128 tiles of 16 rows on 132 SMs);
  * `--section row_gemv`: a multi-row GEMV on the CUDA cores: the one-row GEMV's tiling with one fp32 accumulator
    per token, each weight chunk loaded once for every row (optionally one chunk ahead);
  * `--section row_grid`: the engine's GEMV kernel, one program per (token, tile of output rows), the tokens of a
    tile launched next to each other (`triton_gemv.ROW_GRID_MAX_TOKENS`): the weight tile is read by M programs at
    about the same time (one from memory, the rest from L2 if it holds), and a narrow product gets M times the
    programs to keep loads in flight.

Each candidate configuration is checked against F.linear in fp32 (2% of the largest output) before it is timed;
rows name the best. Shapes: the Llama-3.2-1B target's q/k/v, o, down, gate/up and LM head, and the Llama-100M
draft's, each with the engine's fusions (a folded pre-norm on q/k/v, gate/up and the head; a residual on o and down).

    python benchmarks/diagnostics/skinny_alternatives.py --section split_k --out skinny_split_k.json
    python benchmarks/diagnostics/skinny_alternatives.py --section row_gemv --tokens 2,3,5,9 --out skinny_row_gemv.json
    python benchmarks/diagnostics/skinny_alternatives.py --section row_grid --out skinny_row_grid.json

    python benchmarks/diagnostics/skinny_alternatives.py --table skinny_split_k.json   # any machine

Prints a line per (tokens, shape) and writes the JSON at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (gpu_cudagraphs)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/diagnostics/ (gemv_bandwidth)

from specexp.models import triton_gemv
from specexp.models.triton_support import AVAILABLE, tl, triton

# (N, K, count, residual, folded norm): the Llama-3.2-1B products, then the Llama-100M draft's
SHAPES = [(3072, 2048, 16, False, True), (2048, 2048, 16, True, False), (2048, 8192, 16, True, False),
          (16384, 2048, 16, False, True), (128256, 2048, 1, False, True), (1536, 768, 8, False, True),
          (768, 768, 8, True, False), (768, 2048, 8, True, False), (4096, 768, 8, False, True)]
# split_k: (BLOCK_N, BLOCK_K, num_warps, num_stages) x SPLIT; row_gemv: (BLOCK_N, BLOCK_K, num_warps, one ahead)
SPLIT_TILES = [(16, 512, 4, 2), (16, 512, 4, 4), (16, 256, 4, 3), (32, 512, 4, 3), (32, 256, 4, 3), (64, 128, 4, 4)]
SPLITS = (1, 2, 4, 8)
ROW_GEMV_CONFIGS = [(n, k, w, ahead) for n in (1, 2, 4, 8) for k in (128, 256, 512, 1024) for w in (4, 8)
                    for ahead in (False, True)]
# row_grid: (BLOCK_N, BLOCK_K, num_warps, one ahead), around the one-row GEMV's tiles (triton_gemv's BLOCK_N,
# NORM_BLOCK_N, HEAD_CONFIG)
ROW_GRID_CONFIGS = [(n, k, 4, ahead) for n in (2, 4, 8, 16) for k in (256, 512, 1024) for ahead in (False, True)]
ROW_GRID_CONFIGS += [(16, 256, 8, False), (16, 256, 8, True)]
SECTIONS = ("split_k", "row_gemv", "row_grid")
MAX_ACCUMULATOR_REGISTERS = 128  # row_gemv / row_grid configurations whose fp32 accumulators need more per thread are skipped
EPS = 1e-5


if AVAILABLE:

    @triton.jit
    def _split_k_kernel(x_ptr, w_ptr, res_ptr, y_ptr, part_ptr, squares_ptr, count_ptr, M, N, K, K_PER_SPLIT,
                        stride_x, stride_w, stride_y, eps, HAS_RESIDUAL: tl.constexpr, NORM: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
        tile = tl.program_id(0)
        split = tl.program_id(1)
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        tokens = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_K)
        row_ok = rows < N
        token_ok = tokens < M
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        gram = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
        k_start = split * K_PER_SPLIT
        k_end = tl.minimum(K, k_start + K_PER_SPLIT)
        for k0 in range(k_start, k_end, BLOCK_K):
            k = k0 + cols
            k_ok = k < k_end
            x = tl.load(x_ptr + tokens[:, None] * stride_x + k[None, :], mask=token_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(w_ptr + rows[:, None] * stride_w + k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            if NORM:
                gram = tl.dot(x, tl.trans(x), gram)
            acc = tl.dot(x, tl.trans(w), acc)
        tl.store(part_ptr + (split * BLOCK_M + tokens[:, None]) * N + rows[None, :], acc, mask=row_ok[None, :])
        if NORM:  # this split's sum of squares per token: the diagonal of x x^T
            squares = tl.sum(tl.where(tokens[:, None] == tokens[None, :], gram, 0.0), axis=1)
            tl.store(squares_ptr + (tile * SPLIT + split) * BLOCK_M + tokens, squares)
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLIT - 1:  # the tile's last split: reduce
            y = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            total = tl.zeros([BLOCK_M], dtype=tl.float32)
            for s in tl.static_range(SPLIT):  # in split order, whatever order the splits finished in
                y += tl.load(part_ptr + (s * BLOCK_M + tokens[:, None]) * N + rows[None, :], mask=row_ok[None, :],
                             other=0.0, cache_modifier=".cg")
                if NORM:
                    total += tl.load(squares_ptr + (tile * SPLIT + s) * BLOCK_M + tokens, cache_modifier=".cg")
            if NORM:
                y = y / tl.sqrt(total / K + eps)[:, None]
            out = tokens[:, None] * stride_y + rows[None, :]
            ok = token_ok[:, None] & row_ok[None, :]
            if HAS_RESIDUAL:
                y += tl.load(res_ptr + out, mask=ok, other=0.0).to(tl.float32)
            tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next product

    @triton.jit
    def _row_gemv_kernel(x_ptr, w_ptr, res_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y, eps,
                         HAS_RESIDUAL: tl.constexpr, NORM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        tokens = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_K)
        row_ok = rows < N
        token_ok = tokens < M
        w_rows = w_ptr + rows[:, None] * stride_w
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        if AHEAD:
            w_next = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + cols
            k_ok = k < K
            if AHEAD:  # each weight chunk loaded one chunk ahead
                w = w_next
                ahead = k + BLOCK_K
                w_next = tl.load(w_rows + ahead[None, :], mask=row_ok[:, None] & (ahead < K)[None, :], other=0.0)
            else:
                w = tl.load(w_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_ptr + tokens[:, None] * stride_x + k[None, :], mask=token_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
            if NORM:
                squares += x * x
            acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
        y = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]
        if NORM:
            y = y / tl.sqrt(tl.sum(squares, axis=1) / K + eps)[:, None]
        out = tokens[:, None] * stride_y + rows[None, :]
        ok = token_ok[:, None] & row_ok[None, :]
        if HAS_RESIDUAL:
            y += tl.load(res_ptr + out, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=ok)


@dataclass
class SplitKWorkspace:
    """The split-K kernel's scratch, allocated once: fp32 partial sums [max_split, 16, max_n], fp32 sums of squares
    [max_tiles, max_split, 16], and an int32 arrival count per tile [max_tiles], zero between products."""

    partials: torch.Tensor
    squares: torch.Tensor
    counts: torch.Tensor

    @classmethod
    def allocate(cls, device, max_n: int = 131072, max_split: int = 8, max_tiles: int = 8192) -> SplitKWorkspace:
        return cls(torch.empty(max_split * 16 * max_n, device=device, dtype=torch.float32),
                   torch.empty(max_tiles * max_split * 16, device=device, dtype=torch.float32),
                   torch.zeros(max_tiles, device=device, dtype=torch.int32))


def split_k(x: torch.Tensor, w: torch.Tensor, work: SplitKWorkspace, config: tuple[int, int, int, int, int],
            residual: torch.Tensor | None = None, norm: bool = False) -> torch.Tensor:
    """x [M, K] (M <= 16) @ w [N, K]^T, with rms_norm(x) first if `norm` (a folded pre-norm) and `residual` [M, N]
    added in place and returned; config (BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT). [M, N] in x's dtype."""
    block_n, block_k, warps, stages, split = config
    m, k = x.shape
    n = w.shape[0]
    out = residual if residual is not None else torch.empty(m, n, device=x.device, dtype=x.dtype)
    k_per_split = triton.cdiv(triton.cdiv(k, block_k), split) * block_k
    _split_k_kernel[(triton.cdiv(n, block_n), split)](
        x, w, out, out, work.partials, work.squares, work.counts, m, n, k, k_per_split, x.stride(0), w.stride(0),
        out.stride(0), EPS, HAS_RESIDUAL=residual is not None, NORM=norm, BLOCK_M=16, BLOCK_N=block_n,
        BLOCK_K=block_k, SPLIT=split, num_warps=warps, num_stages=stages)
    return out


def row_gemv(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int, bool],
             residual: torch.Tensor | None = None, norm: bool = False) -> torch.Tensor:
    """As :func:`split_k`, on the multi-row GEMV; config (BLOCK_N, BLOCK_K, num_warps, one chunk ahead)."""
    block_n, block_k, warps, ahead = config
    m, k = x.shape
    n = w.shape[0]
    out = residual if residual is not None else torch.empty(m, n, device=x.device, dtype=x.dtype)
    _row_gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, out, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), EPS, HAS_RESIDUAL=residual is not None,
        NORM=norm, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead,
        num_warps=warps)
    return out


def row_grid(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int, bool],
             residual: torch.Tensor | None = None, norm: bool = False) -> torch.Tensor:
    """As :func:`split_k`, on the engine's GEMV kernel launched a program per (row, tile), as `triton_gemv.gemv` runs
    products of up to ROW_GRID_MAX_TOKENS rows, in stream order; config (BLOCK_N, BLOCK_K, num_warps, each weight
    chunk loaded one ahead)."""
    block_n, block_k, warps, ahead = config
    m, k = x.shape
    n = w.shape[0]
    out = residual if residual is not None else torch.empty(m, n, device=x.device, dtype=x.dtype)
    triton_gemv._gemv_kernel[(m * triton.cdiv(n, block_n),)](
        x, x, w, x, out, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), EPS, HAS_BIAS=False,
        HAS_RESIDUAL=residual is not None, NORM=norm, SCALE=False, BLOCK_N=block_n, BLOCK_K=block_k,
        PREFETCH_W=ahead, num_warps=warps)
    return out


def reference(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None, norm: bool) -> torch.Tensor:
    """fp32 [M, N]: the product each kernel computes, from F.linear."""
    y = torch.nn.functional.linear(x.float(), w.float())
    if norm:
        y = y / x.float().pow(2).mean(-1, keepdim=True).add(EPS).sqrt()
    return y if residual is None else y + residual.float()


def candidates(section: str, num_tokens: int, k: int) -> list[tuple]:
    """The configurations tried for a product of `num_tokens` rows and K = k."""
    if section == "split_k":
        return [(*tile, split) for split in SPLITS for tile in SPLIT_TILES if k // tile[1] >= split]
    if section == "row_grid":
        return [c for c in ROW_GRID_CONFIGS if c[0] * c[1] // (32 * c[2]) <= MAX_ACCUMULATOR_REGISTERS]
    tokens = triton.next_power_of_2(num_tokens)
    return [c for c in ROW_GEMV_CONFIGS if tokens * c[0] * c[1] // (32 * c[2]) <= MAX_ACCUMULATOR_REGISTERS]


def bench_shape(section: str, num_tokens: int, shape: tuple, work: SplitKWorkspace, copy_bw: float) -> dict:
    """One (tokens, shape) row: the engine's GEMV and skinny chains, then each candidate's (checked first)."""
    from gemv_bandwidth import graph_ms

    n, k, count, has_residual, norm = shape
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(count)]
    xs = [torch.randn(num_tokens, k, device="cuda", dtype=torch.bfloat16) for _ in ws]
    rs = [torch.randn(num_tokens, n, device="cuda", dtype=torch.bfloat16) for _ in ws]
    r0 = rs[0].clone()  # the chains add into rs in place
    expected = reference(xs[0], ws[0], r0 if has_residual else None, norm)

    def engine_chain(rows: int):
        def body():
            for w, x, r in zip(ws, xs, rs, strict=True):
                triton_gemv.gemv(x[:rows], w, residual=r[:rows] if has_residual else None, rms_only=norm, eps=EPS)
        return body

    row = {"M": num_tokens, "N": n, "K": k, "count": count, "default_cfg": triton_gemv.skinny_config(n, k),
           "skinny_ms": graph_ms(engine_chain(num_tokens)), "gemv_m1_ms": graph_ms(engine_chain(1))}
    run = {"split_k": split_k, "row_gemv": row_gemv, "row_grid": row_grid}[section]
    extra = {"work": work} if section == "split_k" else {}
    timings = {}
    for config in candidates(section, num_tokens, k):
        try:
            got = run(xs[0], ws[0], config=config, residual=r0.clone() if has_residual else None, norm=norm, **extra)
            err = ((got.float() - expected).abs().max() / expected.abs().max()).item()
            if err > 2e-2:
                raise AssertionError(f"relative error {err:.2e}")

            def body(config=config):
                for w, x, r in zip(ws, xs, rs, strict=True):
                    run(x, w, config=config, residual=r if has_residual else None, norm=norm, **extra)
            timings[str(config)] = graph_ms(body)
        except (RuntimeError, AssertionError) as exc:  # recorded; the other candidates still run
            timings[str(config)] = f"error {str(exc).splitlines()[0][:100]}"
    row[f"{section}_ms"] = timings
    ok = {c: ms for c, ms in timings.items() if isinstance(ms, float)}
    weight_bytes = sum(w.numel() * w.element_size() for w in ws)

    def share(ms: float) -> str:
        return f"{ms:.4f} ms ({weight_bytes / (ms / 1e3) / copy_bw:.0%})"

    row["best"] = min(ok, key=ok.get) if ok else None
    print(f"M={num_tokens} {n}x{k} x{count}: gemv(M=1) {share(row['gemv_m1_ms'])}, skinny {row['default_cfg']} "
          f"{share(row['skinny_ms'])}, best {section} {row['best']} {share(ok[row['best']]) if ok else 'none'}",
          flush=True)
    return row


def render_table(result: dict, tokens: list[int] | None = None) -> str:
    """A markdown table of one result: per (tokens, shape) the one-row GEMV's, the skinny kernel's and the best
    alternative's ms per chain replay, each with its fraction of the copy bandwidth (rows of `tokens` only, if
    given)."""
    section = next(s for s in SECTIONS if any(f"{s}_ms" in r for r in result["rows"]))
    lines = [f"| M | weight [N, K] x count | one-row GEMV ms | skinny ms | best {section} ms (config) |",
             "|---|---|---|---|---|"]
    for r in result["rows"]:
        if tokens is not None and r["M"] not in tokens:
            continue
        def cell(ms: float, r: dict = r) -> str:
            weight_bytes = 2 * r["N"] * r["K"] * r["count"]  # bf16
            return f"{ms:.4f} ({weight_bytes / (ms / 1e3) / result['copy_bw']:.0%})"

        best = r["best"]
        alternative = f"{cell(r[f'{section}_ms'][best])} {best}" if best else "none ran"
        lines.append(f"| {r['M']} | [{r['N']}, {r['K']}] x {r['count']} | {cell(r['gemv_m1_ms'])} "
                     f"| {cell(r['skinny_ms'])} | {alternative} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=SECTIONS)
    parser.add_argument("--tokens", default=None, help="comma-separated rows of x (2..16; default 2,5,9); with "
                        "--table, the rows shown")
    parser.add_argument("--out", default=None, help="JSON file (default skinny_{section}.json)")
    parser.add_argument("--table", nargs="+", default=None, help="print the table of result JSON files and exit")
    args = parser.parse_args()
    try:
        tokens = [int(m) for m in (args.tokens or "2,5,9").split(",")]
    except ValueError:
        parser.error(f"--tokens={args.tokens!r}: comma-separated integers expected")
    if any(not 2 <= m <= 16 for m in tokens):
        parser.error(f"--tokens={args.tokens!r}: each must be 2..16")
    if args.table:
        missing = [p for p in args.table if not Path(p).is_file()]
        if missing:
            parser.error(f"--table: no such result file: {', '.join(missing)}")
        shown = tokens if args.tokens else None
        print("\n\n".join(render_table(json.loads(Path(p).read_text()), shown) for p in args.table))
        return
    if args.section is None:
        parser.error("--section split_k|row_gemv|row_grid is required to measure (or --table FILE... to print)")
    if not torch.cuda.is_available() or not AVAILABLE:
        sys.exit("skinny_alternatives.py needs a CUDA GPU and triton")
    from gpu_cudagraphs import copy_bandwidth_bytes_per_s

    torch.manual_seed(0)
    copy_bw = copy_bandwidth_bytes_per_s()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    work = SplitKWorkspace.allocate("cuda")
    rows = []
    for num_tokens in tokens:
        for shape in SHAPES:
            rows.append(bench_shape(args.section, num_tokens, shape, work, copy_bw))
            torch.cuda.empty_cache()
    result = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}, "copy_bw": copy_bw,
              "rows": rows}
    out = Path(args.out or f"skinny_{args.section}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
