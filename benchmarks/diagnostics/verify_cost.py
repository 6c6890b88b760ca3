"""What a verify of k + 1 tokens costs against a plain decode step, kernel by kernel, on a GPU.

Leviathan's formula prices the target's verify of k + 1 tokens at one plain decode step. On an H200
(2026-11-30) the engine's verify cost 1.18-1.25 plain steps at every k with cuBLAS for 2+ rows, while the
projections alone stream 2-4 rows as fast as one (`gemv_bandwidth.py --skinny-tokens`). This script says where
the rest goes (`experiments/2026-11-29-cudagraphs-h200/`). Per pair (real-size random weights, bf16, batch 1, the kernels of `engine=cuda`) and
per k it replays the captured graphs alone, back to back, and reports device milliseconds per replay:

  - `target_verify` (k + 1 tokens, logits and rejection sampler included): k = 0 is the plain decode step;
  - `draft_prefill` (k >= 1; the draft's first forward over the accepted tokens);
  - `draft_decode` per step (k >= 2; the fused multi-step decode graph divided by k - 1);

and, from a profile of the replays, every kernel's device µs per replay. The summary lists the kernels whose
time grows most from the k = 0 verify to each k's verify.

    python benchmarks/diagnostics/verify_cost.py --pairs lfm2-1.2b+lfm2-350m --ks 0,1,2,4 --out verify_cost.json
                                     [--linear-kernel triton_gemv|triton_skinny|cublas] [--no-silu-in-down-gemv]
                                     [--[no-]silu-in-gate-up [target|draft]]
                                     [--skinny-early-launch both|target|draft|none]

Needs only torch, safetensors and tokenizers (and a CUDA GPU). Rewrites its JSON after every k.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (gpu_cudagraphs)

from gpu_cudagraphs import (
    CUDA_KERNELS,
    RANDOM_PAIRS,
    ZOO,
    add_linear_kernel_flags,
    back_to_back_ms,
    cuda_ms,
    make_engine,
    profile_kernels,
)

from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor
from specexp.models import load_model, skinny_configs
from specexp.models.linear_ops import LINEAR_KERNELS


def kernel_us_per_call(fn, calls: int = 10) -> dict[str, float]:
    """Device µs per call of every kernel `fn` launches (graph replays included), by kernel name."""
    per_name: dict[str, float] = collections.defaultdict(float)
    for name, _, us in profile_kernels(fn, calls):
        per_name[name[:120]] += us / calls
    return dict(per_name)


def measure_graph(replay, reset=None) -> dict:
    """Device ms per replay and its kernels (µs per replay, largest first). Without `reset`, replays run back to
    back; a graph that advances its own metadata on every replay (the fused draft decode moves its positions)
    gets `reset` (re-stage its capture inputs) before a few synchronised replays instead, so it stays within
    its key-length bucket."""
    if reset is None:
        kernels, ms = kernel_us_per_call(replay), back_to_back_ms(replay, iters=50)
    else:
        reset()
        kernels = kernel_us_per_call(replay, calls=3)
        reset()
        ms = cuda_ms(replay, iters=8, warmup=1)
    return {"ms": ms, "kernel_us": dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
            "kernel_sum_us": sum(kernels.values())}


def measure_k(target, draft, k: int, kernels: dict) -> dict:
    """The graphs of one k at batch 1 and the shortest key-length bucket."""
    engine = make_engine(target, draft if k else None, k, 1, graphs=True, rejection="synthetic", rate=0.8,
                         kernels=kernels)
    keys = min(engine.seq_len_buckets)
    verify = BatchExecutionDescriptor(1, k + 1, FULL, keys, k)  # graphs are keyed by (size, k, bucket)
    engine._prepare_verify_capture(verify)
    row = {"target_verify": measure_graph(lambda: engine.verify_graphs.replay(verify))}
    spec = engine.speculator
    if k >= 1:
        # v + 2 slots keyed by k, or two slots under one key for every k (`engine.draft_prefill_region`)
        region_k = k if spec.prefill_graphs.per_k else 0
        prefill = BatchExecutionDescriptor(1, spec.prefill_graphs.tokens_for(region_k), FULL, keys, region_k)
        spec._prepare_prefill_capture(prefill)
        row["draft_prefill"] = measure_graph(lambda: spec.prefill_graphs.replay(prefill))
    if k >= 2:
        decode = BatchExecutionDescriptor(1, 1, FULL, keys, k)
        fused = measure_graph(lambda: spec.decode_graphs.replay(decode), lambda: spec._prepare_decode_capture(decode))
        row["draft_decode_per_step"] = {"ms": fused["ms"] / (k - 1), "kernel_sum_us": fused["kernel_sum_us"] / (k - 1),
                                        "kernel_us": {n: us / (k - 1) for n, us in fused["kernel_us"].items()}}
    return row


def growth(base: dict[str, float], other: dict[str, float], top: int = 12) -> list[dict]:
    """Kernels whose µs per replay grew most from `base` to `other` (new kernels count from 0)."""
    names = set(base) | set(other)
    rows = [{"kernel": n, "base_us": base.get(n, 0.0), "us": other.get(n, 0.0),
             "delta_us": other.get(n, 0.0) - base.get(n, 0.0)} for n in names]
    rows.sort(key=lambda r: -abs(r["delta_us"]))
    return rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=",".join(RANDOM_PAIRS), help=f"comma-separated: {', '.join(RANDOM_PAIRS)}")
    parser.add_argument("--ks", default="0,1,2,4", help="comma-separated depths (must include 0)")
    parser.add_argument("--linear-kernel", default=CUDA_KERNELS["linear_kernel"], choices=sorted(LINEAR_KERNELS))
    parser.add_argument("--fold-norm-weights", action=argparse.BooleanOptionalAction,
                        default=CUDA_KERNELS["fold_norm_weights"],
                        help="engine.fold_norm_weights: pre-norm weights folded into the projections")
    parser.add_argument("--silu-in-down-gemv", action=argparse.BooleanOptionalAction,
                        default=CUDA_KERNELS["silu_in_down_gemv"],
                        help="engine.silu_in_down_gemv: the MLP's SiLU product of one token inside the down GEMV")
    add_linear_kernel_flags(parser)
    parser.add_argument("--out", default="verify_cost.json")
    args = parser.parse_args()
    pairs = args.pairs.split(",")
    unknown = [p for p in pairs if p not in RANDOM_PAIRS]
    if unknown:
        parser.error(f"--pairs: unknown {unknown}; valid: {', '.join(RANDOM_PAIRS)}")
    try:
        ks = sorted({int(k) for k in args.ks.split(",")})
    except ValueError:
        parser.error(f"--ks={args.ks!r}: comma-separated integers expected")
    if ks[0] != 0:
        parser.error(f"--ks={args.ks!r}: must include 0 (the plain decode step every verify is compared with)")
    if not torch.cuda.is_available():
        sys.exit("verify_cost.py needs a CUDA GPU")
    # no prompt-prefill graphs: this script replays the verify and draft graphs alone, never a prompt's
    kernels = dict(CUDA_KERNELS, linear_kernel=args.linear_kernel, fold_norm_weights=args.fold_norm_weights,
                   silu_in_down_gemv=args.silu_in_down_gemv, silu_in_gate_up=args.silu_in_gate_up,
                   skinny_early_launch=args.skinny_early_launch, gemv_early_launch=args.gemv_early_launch,
                   cudagraph_prefill_tokens=())
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": kernels, "pairs": {},
              "skinny_tiles": skinny_configs.table_in_use(torch.device("cuda"))}
    out = Path(args.out)
    with torch.inference_mode():
        for pair in pairs:
            target_path, draft_path = RANDOM_PAIRS[pair]
            target = load_model(ZOO / target_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
            draft = load_model(ZOO / draft_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=1)
            rows = result["pairs"][pair] = {}
            for k in ks:
                rows[k] = measure_k(target, draft, k, kernels)
                torch.cuda.empty_cache()
                plain = rows[0]["target_verify"]
                verify = rows[k]["target_verify"]
                line = (f"{pair} k={k}: verify {verify['ms']:.3f} ms = {verify['ms'] / plain['ms']:.2f} plain steps "
                        f"(kernels {verify['kernel_sum_us']:.0f} us)")
                for part in ("draft_prefill", "draft_decode_per_step"):
                    if part in rows[k]:
                        line += f", {part} {rows[k][part]['ms']:.3f} ms = {rows[k][part]['ms'] / plain['ms']:.2f}"
                print(line, flush=True)
                if k:
                    rows[k]["verify_growth_over_k0"] = growth(plain["kernel_us"], verify["kernel_us"])
                    for r in rows[k]["verify_growth_over_k0"][:8]:
                        print(f"    {r['delta_us']:+7.1f} us  {r['base_us']:6.1f} -> {r['us']:6.1f}  "
                              f"{r['kernel'][:90]}", flush=True)
                out.write_text(json.dumps(result, indent=1))
            del target, draft
            torch.cuda.empty_cache()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
