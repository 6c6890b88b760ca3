"""The LM head of a batch-1 step with the model's final norm fused into its GEMV or not, on a GPU: for each head
shape of the zoo's real-size models, one CUDA graph of `--chain` back-to-back heads (one row of x, bf16, fp32
logits, launched early as `engine=cuda` launches one-row GEMVs on sm_90+) per variant:

- `apart`: the final norm as its own kernel (the compiled RMSNorm), then the head's plain GEMV on the GEMV's default
  tile (`triton_gemv.BLOCK_N` rows a program; what the engine ran before the norm moved into the head);
- `apart_head_tile`: the same on the head's tile (`triton_gemv.head_config`);
- `fused_head_tile`: the norm computed inside the head's GEMV, on the head's tile (what the engine runs);
- `fused_norm_tile`: the same on the pre-norm projections' tile (`triton_gemv.NORM_BLOCK_N` rows a program).

Each variant's graph is replayed in alternating rounds; per variant the mean ms a head over rounds with its 95% t
interval (n = rounds), and whether its logits match `apart`'s within bf16 rounding.

    python benchmarks/diagnostics/head_norm_fusion.py --out head_norm_fusion.json [--rounds 5] [--chain 8]
    python benchmarks/diagnostics/head_norm_fusion.py --table head_norm_fusion.json [...]   (any machine)

Measuring needs torch, triton and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (gpu_cudagraphs)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/diagnostics/ (gemv_bandwidth)

from gemv_bandwidth import capture
from gpu_cudagraphs import cuda_ms
from result_tables import print_result_tables

from specexp.measure.intervals import repeat_summary
from specexp.models import triton_gemv, triton_support
from specexp.models.config import ModelConfig
from specexp.models.loader import load_config
from specexp.models.pointwise import compiled_pointwise_ops

ZOO = Path(__file__).resolve().parents[2] / "specexp" / "zoo" / "configs"
MODELS = ("llama-3.2-1b", "llama-100m-draft", "lfm2-1.2b", "lfm2-350m")


def head_shape(config: ModelConfig) -> tuple[int, int]:
    """(vocab, hidden): the LM head's weight shape."""
    return config.vocab_size, config.hidden_size


def variants(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> dict:
    """name -> fn() computing fp32 logits [1, vocab] of rms_norm(x) * norm_weight through the head."""
    early = triton_support.programmatic_launch(x.device)
    rms_norm = compiled_pointwise_ops().rms_norm
    block_k = min(triton_gemv.MAX_BLOCK_K, triton_gemv.triton.next_power_of_2(weight.shape[1]))
    head = triton_gemv.head_config(weight.shape[1])

    def apart(config=None):
        return triton_gemv.gemv(rms_norm(x, norm_weight, eps), weight, out_dtype=torch.float32, pdl=early,
                                config=config)

    def fused(config):
        return triton_gemv.gemv(x, weight, norm_weight=norm_weight, eps=eps, out_dtype=torch.float32, pdl=early,
                                config=config)

    return {"apart": apart, "apart_head_tile": lambda: apart(head), "fused_head_tile": lambda: fused(head),
            "fused_norm_tile": lambda: fused((triton_gemv.NORM_BLOCK_N, block_k, triton_gemv.NUM_WARPS))}


def bench_model(name: str, rounds: int, chain: int) -> dict:
    config = load_config(ZOO / name)
    vocab, hidden = head_shape(config)
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(vocab, hidden, device="cuda", generator=gen) / hidden**0.5).to(torch.bfloat16)
    x = (torch.randn(1, hidden, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    norm_weight = (torch.rand(hidden, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
    fns = variants(x, weight, norm_weight, config.rms_norm_eps)
    reference = fns["apart"]()
    graphs = {v: capture(lambda fn=fn: [fn() for _ in range(chain)]) for v, fn in fns.items()}
    times = {v: [] for v in fns}
    for _ in range(rounds):
        for v, graph in graphs.items():
            times[v].append(cuda_ms(graph.replay) / chain)
    scale = reference.abs().max().item()
    result = {"head_shape": [vocab, hidden], "variants": {}}
    for v, fn in fns.items():
        err = (fn() - reference).abs().max().item()
        result["variants"][v] = {"ms_per_head": repeat_summary(times[v]), "per_round_ms": times[v],
                                 "max_abs_diff_vs_apart": err, "within_rounding": err <= 2e-2 * (scale + 1)}
        s = result["variants"][v]["ms_per_head"]
        print(f"  {name} [{vocab}, {hidden}] {v:>15}: {s['mean']:.4f} [{s['low']:.4f}, {s['high']:.4f}] ms "
              f"(n = {rounds}), max |diff| {err:.2e}", flush=True)
    return result


def render_table(results: list[tuple[str, dict]]) -> str:
    """Markdown: per file and head shape, each variant's ms a head [95% t interval], the fused head's time over
    `apart`'s, and whether every variant's logits matched `apart`'s within bf16 rounding."""
    names = ("apart", "apart_head_tile", "fused_head_tile", "fused_norm_tile")
    lines = ["| file | GPU | model | head [vocab, hidden] | " + " | ".join(f"{v} ms" for v in names)
             + " | fused_head_tile / apart | logits within rounding | n |",
             "|---|---|---|---|" + "---|" * len(names) + "---|---|---|"]
    for file, result in results:
        for model, row in result["models"].items():
            stats = {v: row["variants"][v]["ms_per_head"] for v in names}
            cells = [f"{s['mean']:.4f} [{s['low']:.4f}, {s['high']:.4f}]" for s in stats.values()]
            ratio = stats["fused_head_tile"]["mean"] / stats["apart"]["mean"]
            ok = "yes" if all(row["variants"][v]["within_rounding"] for v in names) else "**no**"
            lines.append(f"| `{file}` | {result['machine']['gpu']} | {model} | {row['head_shape']} | "
                         + " | ".join(cells) + f" | {ratio:.3f} | {ok} | {result['rounds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", nargs="+", metavar="FILE", help="print the files' table and exit (any machine)")
    parser.add_argument("--out", default="head_norm_fusion.json")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chain", type=int, default=8, help="heads a graph replays back to back")
    args = parser.parse_args(argv)
    if args.table:
        print_result_tables(parser, args.table, render_table)
        return
    models = args.models.split(",")
    if set(models) - set(MODELS) or args.rounds < 2 or args.chain < 1:
        parser.error(f"--models of {', '.join(MODELS)}; --rounds >= 2; --chain >= 1")
    if not torch.cuda.is_available():
        sys.exit("head_norm_fusion.py needs a CUDA GPU")
    result = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "python": platform.python_version()}, "rounds": args.rounds, "chain": args.chain,
              "models": {}}
    for name in models:
        result["models"][name] = bench_model(name, args.rounds, args.chain)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
