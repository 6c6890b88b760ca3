"""How close can batch-1 weight-streaming GEMMs get to the HBM copy bandwidth? (GPU; torch + triton only)

A batch-1 decode step of a 1B-class target is a chain of GEMVs, y[1, N] = x[1, K] @ W[N, K]^T, one per
projection, each reading its whole weight once. This script replays exactly those GEMVs -- every weight of the
real-size random-weight targets, stacked as the engine stacks them (q/k/v, gate/up, LFM2's w1/w3), plus the
LM head -- inside one CUDA graph per implementation, and reports weight bytes / replay time against the
device's copy bandwidth:

  * `cublas_linear`: `x @ W^T` (the GEMM `F.linear(x, W)` runs) into a preallocated output, the engine's path for
    stacked projections;
  * `cublas_addmm`: `residual.addmm_(x, W.t())`, the engine's path for residual-adding output projections;
  * `triton_gemv`: `specexp.models.triton_gemv` (`engine.linear_kernel=triton_gemv`), a row-blocked Triton
    GEMV with fp32 accumulation, adding into the output as addmm_ does; its block shape tuned per weight
    shape here (the engine uses the one that won every shape on the H200).

The weights are distinct tensors (no L2 reuse between layers), as in the model. What this bounds: the
engine's batch-1 target step cannot beat the GEMV chain's time; a step at 60% of the copy bandwidth
needs the chain itself well above 60%.

With `--skinny-tokens M,...` it also times the same chain for M rows of x (a batch-1 verify of k + 1 = M tokens):
`cublas_linear` against the skinny Triton kernel (`engine.linear_kernel=triton_skinny`) at its default block
shapes and at the best SKINNY_CONFIGS entry per weight shape, and with the RMSNorm before each product fused in
(`+norm`: as the engine fuses it into the q/k/v and gate/up products). On an sm_90+ GPU every Triton chain is also
timed with its kernels launched early (` pdl`: `engine.programmatic_launch`, each GEMV fetching its first weight
chunk while the one before it finishes). A verify that streams its weights as fast as a
decode step costs what Leviathan's formula assumes: one target step. --models also takes the two drafts'
shapes (lfm2-350m, llama-100m), whose draft prefill regions are such products too.

    python benchmarks/diagnostics/gemv_bandwidth.py --out gemv_bandwidth.json [--models llama-3.2-1b,lfm2-1.2b]
                                        [--skinny-tokens 2,4,9]

Prints figures as measured and writes the JSON after each model.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (gpu_cudagraphs)

from gpu_cudagraphs import copy_bandwidth_bytes_per_s, cuda_ms

from specexp.models import load_model, triton_gemv, triton_support
from specexp.models.stacked import StackedLinear

ZOO = Path(__file__).resolve().parents[2] / "specexp" / "zoo"
MODELS = {"llama-3.2-1b": "configs/llama-3.2-1b", "lfm2-1.2b": "configs/lfm2-1.2b",
          "lfm2-350m": "configs/lfm2-350m", "llama-100m": "configs/llama-100m-draft"}
# (BLOCK_N, BLOCK_K, num_warps) tried per weight shape; BLOCK_N * BLOCK_K bounds registers per program
TRITON_CONFIGS = [*itertools.product((4, 8, 16), (256, 512), (4, 8)), (2, 1024, 4), (32, 256, 8)]
# (BLOCK_N, BLOCK_K, num_warps, num_stages) tried per weight shape for the skinny kernel, next to its default
SKINNY_CONFIGS = [*itertools.product((16, 32), (128, 256, 512), (4,), (2, 4)), (64, 128, 4, 4), (64, 256, 8, 3),
                  (16, 1024, 4, 2), (16, 512, 8, 3), (32, 256, 8, 3)]

def gemm_weights(model: nn.Module) -> list[torch.Tensor]:
    """Every weight a batch-1 forward streams through a GEMM, as the engine multiplies it: each stack's
    stacked tensor once, every other Linear's weight, and the LM head ([N, K] each, distinct storage)."""
    stacks = [v for m in model.modules() for v in vars(m).values() if isinstance(v, StackedLinear)]
    stacked_ids = {id(lin) for s in stacks for lin in s.linears}
    weights = [s.weights()[0] for s in stacks]
    weights += [m.weight for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in stacked_ids]
    seen, unique = set(), []
    for w in weights:  # a tied LM head is the embedding: count it once
        if w.data_ptr() not in seen:
            seen.add(w.data_ptr())
            unique.append(w)
    return unique


def capture(body) -> torch.cuda.CUDAGraph:
    """A CUDA graph capturing body() (run once eagerly on a side stream first: compiles, allocator warm-up)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def graph_ms(body) -> float:
    """Median ms of one replay of a CUDA graph capturing body() (:func:`capture`)."""
    return cuda_ms(capture(body).replay)


def chain(weights: list[torch.Tensor], impl: str, configs: dict | None = None, num_tokens: int = 1,
          pdl: bool = False):
    """A body running one product of `num_tokens` rows per weight with implementation `impl`, on preallocated
    buffers (configs: {weight shape: triton config}, or None for the kernel's defaults; pdl: the Triton kernels
    launched with programmatic dependent launch)."""
    xs = [torch.randn(num_tokens, w.shape[1], device=w.device, dtype=w.dtype) for w in weights]
    ys = [torch.zeros(num_tokens, w.shape[0], device=w.device, dtype=w.dtype) for w in weights]
    gs = [torch.rand(w.shape[1], device=w.device, dtype=w.dtype) + 0.5 for w in weights]

    def body():
        for w, x, y, g in zip(weights, xs, ys, gs, strict=True):
            config = configs[tuple(w.shape)] if configs else None
            if impl == "cublas_linear":  # F.linear's GEMM, written straight into y (no extra copy kernel)
                torch.mm(x, w.t(), out=y)
            elif impl == "cublas_addmm":
                y.addmm_(x, w.t())
            elif impl == "triton_norm":  # the RMSNorm before the product fused in (a new output, as the engine's)
                triton_gemv.gemv(x, w, norm_weight=g, eps=1e-5, config=config, pdl=pdl)
            else:
                triton_gemv.gemv(x, w, residual=y, config=config, pdl=pdl)

    return body


def check_gemv(x: torch.Tensor, w: torch.Tensor, config: tuple[int, ...] | None, label: str) -> None:
    """triton_gemv.gemv(x [M, K], w [N, K]) at `config` within 2% (of the largest output) of F.linear in fp32."""
    reference = torch.nn.functional.linear(x.float(), w.float())
    err = (triton_gemv.gemv(x, w, config=config).float() - reference).abs().max().item()
    err /= reference.abs().max().item()
    if err > 2e-2:
        raise AssertionError(f"{label}: relative error {err:.2e}")


def tune_triton(weights: list[torch.Tensor], bytes_per_s: float, candidates=TRITON_CONFIGS,
                num_tokens: int = 1) -> tuple[dict, dict]:
    """Best `candidates` entry per weight shape for `num_tokens` rows of x (timing a graph of all weights of
    that shape), each checked against F.linear first. Returns ({shape: config}, {shape: per-config ms})."""
    best, tried = {}, {}
    for shape in sorted({tuple(w.shape) for w in weights}):
        same = [w for w in weights if tuple(w.shape) == shape]
        x = torch.randn(num_tokens, shape[1], device="cuda", dtype=same[0].dtype)
        timings = {}
        for config in candidates:
            check_gemv(x, same[0], config, f"triton M={num_tokens} {shape} {config}")
            timings[config] = graph_ms(chain(same, "triton", {shape: config}, num_tokens))
        best[shape] = min(timings, key=timings.get)
        tried[str(shape)] = {str(c): ms for c, ms in timings.items()}
        ms = timings[best[shape]]
        print(f"    {shape}: x{len(same)} best {best[shape]} {ms:.3f} ms "
              f"({sum(w.numel() * w.element_size() for w in same) / (ms / 1e3) / bytes_per_s:.0%} of copy bw)",
              flush=True)
    return best, tried


def bench_skinny(weights: list[torch.Tensor], num_tokens: int, total: int, copy_bw: float) -> dict:
    """The chain at `num_tokens` rows: cuBLAS vs the skinny kernel at its default block shape and at the best
    SKINNY_CONFIGS entry per weight shape (each checked against F.linear)."""
    w = weights[0]
    check_gemv(torch.randn(num_tokens, w.shape[1], device="cuda", dtype=w.dtype), w, None,
               f"skinny default M={num_tokens}")
    best, tried = tune_triton(weights, copy_bw, SKINNY_CONFIGS, num_tokens)
    rows = {}
    impls = [("cublas_linear", "cublas_linear", None), ("triton_skinny", "triton", None),
             ("triton_skinny tuned", "triton", best), ("triton_skinny +norm", "triton_norm", None)]
    if triton_support.programmatic_launch(weights[0].device):
        impls += [(f"{label} pdl", impl, configs) for label, impl, configs in impls[1:]]
    for label, impl, configs in impls:
        try:
            ms = graph_ms(chain(weights, impl, configs, num_tokens, pdl=label.endswith(" pdl")))
        except RuntimeError as exc:  # recorded, as in bench_model
            rows[label] = {"error": str(exc).splitlines()[0]}
            continue
        rows[label] = {"graph_ms": ms, "fraction_of_copy_bandwidth": total / (ms / 1e3) / copy_bw}
    print(f"  M={num_tokens}: " + ", ".join(
        f"{label} {row['graph_ms']:.3f} ms ({row['fraction_of_copy_bandwidth']:.0%})" if "graph_ms" in row
        else f"{label} failed ({row['error']})" for label, row in rows.items()),
        flush=True)
    return {"chains": rows, "best_config": {str(s): c for s, c in best.items()}, "tuning_ms": tried}


def bench_model(name: str, path: str, copy_bw: float, skinny_tokens: tuple[int, ...] = ()) -> dict:
    model = load_model(ZOO / path, dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
    weights = gemm_weights(model)
    total = sum(w.numel() * w.element_size() for w in weights)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"== {name}: {len(weights)} GEMV weights, {total / 1e9:.3f} GB ({params / 1e9:.3f} GB of parameters)",
          flush=True)
    out = {"num_gemvs": len(weights), "gemv_weight_bytes": total, "parameter_bytes": params,
           "shapes": {str(s): sum(tuple(w.shape) == s for w in weights) for s in {tuple(w.shape) for w in weights}},
           "chains": {}}
    impls = [("cublas_linear", "cublas_linear", None), ("cublas_addmm", "cublas_addmm", None)]
    if triton_gemv.AVAILABLE:
        configs, out["triton_tuning_ms"] = tune_triton(weights, copy_bw)
        out["triton_best_config"] = {str(s): c for s, c in configs.items()}
        # "+norm": the GEMV at the engine's defaults with the RMSNorm fused (NORM_BLOCK_N rows per program)
        impls += [("triton_gemv", "triton_gemv", configs), ("triton_gemv +norm", "triton_norm", None)]
        if triton_support.programmatic_launch(weights[0].device):  # each launched early, fetching its weights
            impls += [("triton_gemv pdl", "triton_gemv", configs), ("triton_gemv +norm pdl", "triton_norm", None)]
    for label, impl, configs in impls:
        try:
            ms = graph_ms(chain(weights, impl, configs, pdl=label.endswith(" pdl")))
        except RuntimeError as exc:  # an early launch the driver refuses: recorded, the other chains measured
            out["chains"][label] = {"error": str(exc).splitlines()[0]}
            print(f"  {label:17s} failed: {out['chains'][label]['error']}", flush=True)
            continue
        out["chains"][label] = {"graph_ms": ms, "achieved_bytes_per_s": total / (ms / 1e3),
                                "fraction_of_copy_bandwidth": total / (ms / 1e3) / copy_bw}
        print(f"  {label:17s} {ms:.3f} ms  {total / (ms / 1e3) / 1e12:.2f} TB/s "
              f"({total / (ms / 1e3) / copy_bw:.0%} of copy bw)", flush=True)
    if triton_gemv.AVAILABLE and skinny_tokens:
        out["skinny"] = {str(m): bench_skinny(weights, m, total, copy_bw) for m in skinny_tokens}
    del model, weights
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gemv_bandwidth.json")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--skinny-tokens", default="",
                        help=f"comma-separated rows of x (2..{triton_gemv.MAX_TOKENS}) to time the skinny kernel at")
    args = parser.parse_args()
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; valid: {', '.join(MODELS)}")
    try:
        skinny = tuple(int(m) for m in args.skinny_tokens.split(",") if m)
    except ValueError:
        parser.error(f"--skinny-tokens: integers expected, got {args.skinny_tokens!r}")
    if any(not 2 <= m <= triton_gemv.MAX_TOKENS for m in skinny):
        parser.error(f"--skinny-tokens: each must be 2..{triton_gemv.MAX_TOKENS}, got {args.skinny_tokens!r}")
    if not torch.cuda.is_available():
        sys.exit("gemv_bandwidth.py needs a CUDA GPU")
    result = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "python": platform.python_version()},
              "copy_bandwidth_bytes_per_s": copy_bandwidth_bytes_per_s(), "models": {}}
    print(f"copy bandwidth {result['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    for name in args.models.split(","):
        result["models"][name] = bench_model(name, MODELS[name], result["copy_bandwidth_bytes_per_s"], skinny)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    start = time.perf_counter()
    with torch.inference_mode():
        main()
    print(f"total {time.perf_counter() - start:.0f} s")
