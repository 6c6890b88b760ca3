"""What a batch-1 step's context costs on a GPU, per launch configuration of the paged-attention kernel.

The step figures of the other scripts (c in `gpu_cudagraphs.py`, `verify_cost.py`, `kernel_cuts.py`) replay inert
inputs: a row of one key. A request of the end-to-end runs attends over 64-192 keys, and the attention kernel
walks them in tiles of `triton_attention.KEYS_PER_TILE`, one program per (row, KV head): 8 programs for the
Llama-3.2-1B shape, 4 for the Llama-100M draft. Per attention configuration (keys per tile x warps [x pipelining
stages] [/ programs its keys may split over] [+ key tiles loaded ahead, 0 or 1]; the shipped one first) this
script builds batch-1 engines with `engine=cuda`'s kernels, stages their inert inputs at a context of L keys (the
row's last query at position L - 1, a block table of distinct blocks, the smallest key-length bucket that holds L)
and replays, back to back:

  - the target's plain decode step (k = 0) and its verify of k + 1 tokens (`--k`),
  - the draft's plain decode step,

in `--rounds` rounds that alternate the configurations. Per configuration and L: ms per replay (median over the
rounds, and their range), c = draft / target, and the verify in plain steps.

    python benchmarks/diagnostics/attention_context.py --pair llama-3.2-1b+llama-100m --contexts 1,64,128,192 \\
        --configs 64x4/1,64x4,128x8 [--k 4] [--rounds 3] [--min-split-keys 512] --out attention_context.json
    python benchmarks/diagnostics/attention_context.py --table attention_context.json

Needs only torch, safetensors and tokenizers (and a CUDA GPU); `--table` runs anywhere. Rewrites its JSON after
every round.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (gpu_cudagraphs)

from gpu_cudagraphs import CUDA_KERNELS, RANDOM_PAIRS, ZOO, back_to_back_ms, make_engine

from specexp.engine.cudagraph import BatchExecutionDescriptor
from specexp.models import load_model, triton_attention

STEPS = ("target_step_ms", "target_verify_ms", "draft_step_ms")


def parse_config(text: str) -> dict:
    """"KEYSxWARPS[xSTAGES][/SPLITS][+AHEAD]" -> {"keys", "warps", "stages", "splits", "ahead"} (stages None:
    Triton's default; splits: `triton_attention.MAX_SPLITS`, ahead: whether key tiles are loaded one tile ahead,
    `triton_attention.LOAD_AHEAD`; each the shipped value when left out)."""
    rest, plus, ahead = text.partition("+")
    tile, _, splits = rest.partition("/")
    try:
        numbers = [int(p) for p in tile.split("x")]
        max_splits = int(splits) if splits else triton_attention.MAX_SPLITS
        tiles_ahead = int(ahead) if plus else int(triton_attention.LOAD_AHEAD)
    except ValueError:
        numbers, max_splits, tiles_ahead = [], 0, -1
    if len(numbers) not in (2, 3) or numbers[0] < 16 or numbers[0] % 16 or numbers[1] not in (1, 2, 4, 8, 16) \
            or (len(numbers) == 3 and not 1 <= numbers[2] <= 8) or not 1 <= max_splits <= 64 \
            or tiles_ahead not in (0, 1):
        raise ValueError(f"attention configuration {text!r}: KEYSxWARPS[xSTAGES][/SPLITS][+AHEAD] expected, keys a "
                         "multiple of 16, warps 1/2/4/8/16, stages 1-8, splits 1-64, tiles ahead 0 or 1 (e.g. 64x4, "
                         "128x8x2, 64x4/1, 64x4/1+0)")
    return {"keys": numbers[0], "warps": numbers[1], "stages": numbers[2] if len(numbers) == 3 else None,
            "splits": max_splits, "ahead": bool(tiles_ahead)}


def use_config(config: dict) -> None:
    """Launch the attention kernel with `config` from now on (kernels launched by graphs captured after this)."""
    triton_attention.KEYS_PER_TILE = config["keys"]
    triton_attention.NUM_WARPS = config["warps"]
    triton_attention.NUM_STAGES = config["stages"]
    triton_attention.MAX_SPLITS = config["splits"]
    triton_attention.LOAD_AHEAD = config["ahead"]


def stage_context(engine, desc: BatchExecutionDescriptor, context: int) -> None:
    """The inert row of `desc` (staged by `_prepare_verify_capture`) given `context` keys: its Q queries at
    positions context - Q .. context - 1, seq_len = context, blocks 1.. of the cache (0 is the NULL block)."""
    buffers, queries = engine.buffers, desc.num_tokens
    context = max(context, queries)
    buffers.positions[:queries] = torch.arange(context - queries, context, device=buffers.positions.device)
    buffers.seq_lens[:1] = context
    blocks = -(-context // engine.cfg.block_size)
    buffers.block_table[0, :blocks] = torch.arange(1, blocks + 1, dtype=torch.int32, device=buffers.block_table.device)


def build(target, draft, k: int, kernels: dict, max_model_len: int) -> dict:
    """The three batch-1 engines of one configuration: {"target_step_ms", "target_verify_ms", "draft_step_ms"} ->
    (engine, the drafts its verify graph scores)."""
    sized = {"max_model_len": max_model_len, "kernels": kernels}
    return {"target_step_ms": (make_engine(target, None, 0, 1, graphs=True, **sized), 0),
            "target_verify_ms": (make_engine(target, draft, k, 1, graphs=True, rejection="synthetic", rate=0.8,
                                             **sized), k),
            "draft_step_ms": (make_engine(draft, None, 0, 1, graphs=True, **sized), 0)}


def replay_at(engine, v: int, context: int):
    """A function replaying `engine`'s verify graph of v + 1 tokens with its inert row at `context` keys (the graph
    of the smallest key-length bucket that holds them)."""
    desc = engine.verify_graphs.lookup(1, max(context, v + 1), k=v)
    if desc is None:
        raise ValueError(f"context {context}: no verify graph of {v + 1} tokens holds it (buckets "
                         f"{engine.seq_len_buckets})")
    engine._prepare_verify_capture(desc)
    stage_context(engine, desc, context)
    return lambda: engine.verify_graphs.replay(desc)


def measure(pair: str, configs: list[str], contexts: list[int], k: int, rounds: int, out_path: Path) -> dict:
    """Build every configuration's engines, then time them in alternating rounds (the module doc)."""
    target_path, draft_path = RANDOM_PAIRS[pair]
    target = load_model(ZOO / target_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
    draft = load_model(ZOO / draft_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=1)
    kernels = {**CUDA_KERNELS, "cudagraph_prefill_tokens": ()}  # decode and verify graphs only
    engines, parsed = {}, {name: parse_config(name) for name in configs}
    shipped = {"keys": triton_attention.KEYS_PER_TILE, "warps": triton_attention.NUM_WARPS,
               "stages": triton_attention.NUM_STAGES, "splits": triton_attention.MAX_SPLITS,
               "ahead": triton_attention.LOAD_AHEAD}
    for name in configs:
        use_config(parsed[name])
        engines[name] = build(target, draft, k, kernels, max_model_len=max(512, max(contexts) + k + 16))
        print(f"  built {name}", flush=True)
    use_config(shipped)
    result = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "python": platform.python_version()},
              "pair": pair, "k": k, "contexts": contexts, "rounds": rounds, "shipped": shipped,
              "min_split_keys": triton_attention.MIN_SPLIT_KEYS,
              "configs": {name: {"config": parsed[name], **{s: {str(c): [] for c in contexts} for s in STEPS},
                                 "tokens": {}}
                          for name in configs}}
    for round_index in range(rounds):
        for name in (configs if round_index % 2 == 0 else configs[::-1]):
            row = result["configs"][name]
            for step, (engine, v) in engines[name].items():
                for context in contexts:
                    replay = replay_at(engine, v, context)
                    row[step][str(context)].append(back_to_back_ms(replay, iters=50, repeats=3))
                    row["tokens"][f"{step}@{context}"] = engine.step_out[0, : v + 1].tolist()
        out_path.write_text(json.dumps(result, indent=1))
        print(f"  round {round_index + 1} of {rounds} done", flush=True)
    first = result["configs"][configs[0]]["tokens"]
    for name in configs:
        result["configs"][name]["same_tokens_as_first"] = result["configs"][name]["tokens"] == first
    out_path.write_text(json.dumps(result, indent=1))
    return result


def table(results: list[dict]) -> str:
    """Markdown: per file, configuration and context, each step's median ms [range] and c, verify / plain."""
    lines = [("| GPU | pair | attention (keys x warps x stages / splits) | context keys | target step ms | verify ms "
              "(plain steps) | draft step ms | c | same tokens | n |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for row in result["configs"].values():
            for context in result["contexts"]:
                runs = {s: row[s][str(context)] for s in STEPS}
                if not all(runs.values()):
                    continue
                med = {s: statistics.median(v) for s, v in runs.items()}

                def cell(s, med=med, runs=runs):
                    return f"{med[s]:.4f} [{min(runs[s]):.4f}, {max(runs[s]):.4f}]"

                config = row["config"]
                splits = config.get("splits", 1)
                label = (f"{config['keys']} x {config['warps']} x {config['stages'] or 'default'} / {splits}"
                         + (f" (from {result.get('min_split_keys', 0)} keys)" if splits > 1 else "")
                         + ({True: ", tiles loaded ahead", False: ", each tile loaded in turn"}[config["ahead"]]
                            if "ahead" in config else ""))
                lines.append(
                    f"| {result['machine']['gpu']} | {result['pair']} | {label} | {context} | {cell('target_step_ms')} "
                    f"| {cell('target_verify_ms')} ({med['target_verify_ms'] / med['target_step_ms']:.3f}) "
                    f"| {cell('draft_step_ms')} | {med['draft_step_ms'] / med['target_step_ms']:.3f} "
                    f"| {'yes' if row.get('same_tokens_as_first', True) else 'no'} | {len(runs['target_step_ms'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="llama-3.2-1b+llama-100m")
    parser.add_argument("--configs", default="64x4", help="comma-separated KEYSxWARPS[xSTAGES][/SPLITS][+AHEAD]")
    parser.add_argument("--contexts", default="1,64,128,192", help="comma-separated key counts")
    parser.add_argument("--k", type=int, default=4, help="the verify's depth (k + 1 tokens)")
    parser.add_argument("--min-split-keys", type=int, default=triton_attention.MIN_SPLIT_KEYS,
                        help="launches over fewer keys keep one program (triton_attention.MIN_SPLIT_KEYS)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="attention_context.json")
    parser.add_argument("--table", nargs="+", type=Path, help="print the tables of earlier runs and exit")
    args = parser.parse_args()
    if args.table:
        missing = [str(p) for p in args.table if not p.is_file()]
        if missing:
            parser.error(f"--table: no such file: {', '.join(missing)}")
        print(table([json.loads(p.read_text()) for p in args.table]))
        return
    configs = args.configs.split(",")
    try:
        for name in configs:
            parse_config(name)
        contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    if any(c < 1 for c in contexts) or args.k < 1 or args.rounds < 1:
        parser.error(f"--contexts {args.contexts}, --k {args.k}, --rounds {args.rounds}: each must be >= 1")
    if args.min_split_keys < 0:
        parser.error(f"--min-split-keys {args.min_split_keys}: must be >= 0")
    if args.pair not in RANDOM_PAIRS:
        parser.error(f"--pair {args.pair!r}: one of {', '.join(RANDOM_PAIRS)}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --table)")
    triton_attention.MIN_SPLIT_KEYS = args.min_split_keys
    result = measure(args.pair, configs, contexts, args.k, args.rounds, Path(args.out))
    print(table([result]))


if __name__ == "__main__":
    main()
