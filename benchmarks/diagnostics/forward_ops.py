"""Kernel-launching ops per model forward, counted on the CPU: a GPU-free proxy for a decode step's kernel count.

At batch 1 a captured decode step of a 1B model can be bound by how many kernels it runs, not by weight bytes
(on an H200, 2026-11-29, before the kernel cuts: ~550 small kernels at ~1.9 µs each next to 1 ms of GEMMs). This
script runs one forward of each model (random weights, bf16, one request with `--context` cached tokens) under
a dispatch mode that counts every aten op except those that only make views, and prints ops per forward and
per layer with the most frequent ops. Ops that return their input unchanged (a `.to()` to the same dtype) are
not counted, nor a reshape that could return a view. Composite ops count as the aten ops they reach on the CPU; on a GPU a few fuse further (e.g.
`rms_norm` is one kernel there too), so this tracks the GPU launch count closely but not exactly.

    python benchmarks/diagnostics/forward_ops.py [--models llama-3.2-1b,lfm2-1.2b,...] [--tokens 1,5] [--fused-pointwise]
                                     [--out ops.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)

from specexp.engine.short_conv import ShortConvMetadataBuilder
from specexp.models import (
    AttentionMetadata,
    ForwardContext,
    allocate_conv_states,
    allocate_kv_caches,
    load_model,
)
from specexp.models.pointwise import EAGER, PointwiseOps, use_pointwise_ops

# aten ops that only create views or read metadata: no kernel on any device.
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "slice", "select", "unsqueeze", "squeeze", "permute", "expand", "t", "transpose",
    "split", "split_with_sizes", "unbind", "alias", "detach", "as_strided", "_reshape_alias", "reshape",
    "lift_fresh", "empty", "empty_strided", "_local_scalar_dense", "chunk",
})
# ops that are views when they can be and copies otherwise: counted only when they copied.
MAYBE_COPY_OPS = frozenset({"reshape", "flatten", "contiguous", "to"})
BLOCK_SIZE = 16


class OpCounter(TorchDispatchMode):
    """Counts the kernel-launching aten ops dispatched inside the `with` block: {op name: count}."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.fused_depth = 0  # > 0 inside a call counted as one fused kernel (see `fused_as_one`)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.fused_depth:
            return out
        name = func.__name__.split(".")[0]
        if name in MAYBE_COPY_OPS:
            if _shares_storage(out, args[0]):
                return out
        elif name in VIEW_OPS:
            return out
        self.counts[name] += 1
        return out


def fused_as_one(counter: OpCounter) -> PointwiseOps:
    """Eager pointwise ops (RMSNorm, SiLU product, RoPE and its tables, short-conv taps) that `counter` counts as one op per call: what `engine.compile_pointwise` runs (one
    inductor kernel per call). Dynamo does not run compiled code under a dispatch mode, hence the model."""
    def one(name, fn):
        def call(*args):
            counter.counts[f"fused_{name}"] += 1
            counter.fused_depth += 1
            try:
                return fn(*args)
            finally:
                counter.fused_depth -= 1
        return call

    return PointwiseOps(one("rms_norm", EAGER.rms_norm), one("silu_mul", EAGER.silu_mul),
                        one("apply_rope", EAGER.apply_rope), one("conv_taps", EAGER.conv_taps),
                        one("rope_tables", EAGER.rope_tables))


def _shares_storage(out, source) -> bool:
    return (isinstance(out, torch.Tensor) and isinstance(source, torch.Tensor)
            and out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr())


def step_context(model, num_tokens: int, context: int) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
    """(input_ids, positions, ForwardContext) of one request verifying `num_tokens` tokens after `context`
    cached ones — the engine's decode (num_tokens 1) or verify (k + 1) row, as full graphs replay it."""
    seq_len = context + num_tokens
    num_blocks = -(-seq_len // BLOCK_SIZE) + 2
    kv_caches = allocate_kv_caches(model, num_blocks, BLOCK_SIZE, "cpu", torch.bfloat16)
    k = num_tokens - 1
    conv_states = allocate_conv_states(model, 4, k, "cpu", torch.bfloat16) if model.conv_layer_ids else []
    blocks = list(range(1, num_blocks - 1))
    positions = torch.arange(context, seq_len)
    slots = torch.tensor([blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in positions.tolist()])
    attn = AttentionMetadata(
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        block_table=torch.tensor([blocks], dtype=torch.int32),
        slot_mapping=slots, token_req_indices=torch.zeros(num_tokens, dtype=torch.int64),
        max_seq_len=len(blocks) * BLOCK_SIZE, max_query_len=num_tokens, num_actual_tokens=num_tokens,
    )
    conv = None
    if model.conv_layer_ids:
        builder = ShortConvMetadataBuilder(num_spec_tokens=k, use_full_cuda_graph=True, max_num_seqs=4,
                                           max_capture_size=None, device=torch.device("cpu"))
        conv = builder.build(
            query_start_loc_cpu=torch.tensor([0, num_tokens], dtype=torch.int32),
            num_computed_tokens_cpu=torch.tensor([context], dtype=torch.int32),
            num_decode_draft_tokens_cpu=torch.tensor([k], dtype=torch.int32),  # a spec row, as the engine builds
            num_accepted_tokens_cpu=torch.tensor([1], dtype=torch.int32),
            state_indices_cpu=torch.tensor([1], dtype=torch.int32),
            num_reqs_padded=1,
        )
    ctx = ForwardContext(attn=attn, conv=conv, kv_caches=kv_caches, conv_states=conv_states)
    return torch.zeros(num_tokens, dtype=torch.int64), positions, ctx


@torch.inference_mode()
def count_forward(name: str, num_tokens: int, context: int, fused_pointwise: bool = False) -> dict:
    """Ops of one forward + logits of zoo config `name` over `num_tokens` tokens; fused_pointwise: count each
    fused pointwise call as one op (as `engine.compile_pointwise` runs them)."""
    model = load_model(f"configs/{name}", weights="random", dtype=torch.bfloat16)
    ids, positions, ctx = step_context(model, num_tokens, context)
    model.compute_logits(model(ids, positions, ctx))  # first forward: stacks weights, warms caches
    counter = OpCounter()
    if fused_pointwise:
        use_pointwise_ops(model, fused_as_one(counter))
    with counter:
        model.compute_logits(model(ids, positions, ctx))
    total = sum(counter.counts.values())
    layers = model.config.num_hidden_layers
    return {"model": name, "num_tokens": num_tokens, "context_tokens": context, "fused_pointwise": fused_pointwise,
            "ops_per_forward": total,
            "ops_per_layer": total / layers, "num_layers": layers, "ops": dict(counter.counts.most_common())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3.2-1b,llama-100m-draft,lfm2-1.2b,lfm2-350m",
                        help="comma-separated zoo configs (specexp/zoo/configs/)")
    parser.add_argument("--tokens", default="1,5", help="tokens per forward: 1 = decode, k + 1 = verify")
    parser.add_argument("--context", type=int, default=200, help="cached tokens before the step")
    parser.add_argument("--fused-pointwise", action="store_true",
                        help="count each fused pointwise call (RMSNorm, SiLU product, RoPE, short-conv taps) as one "
                             "op, as engine.compile_pointwise runs them")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        for num_tokens in (int(t) for t in args.tokens.split(",")):
            row = count_forward(name, num_tokens, args.context, args.fused_pointwise)
            rows.append(row)
            top = ", ".join(f"{op} {n}" for op, n in list(row["ops"].items())[:8])
            print(f"{name:18s} T={num_tokens}: {row['ops_per_forward']:4d} ops/forward, "
                  f"{row['ops_per_layer']:.1f}/layer ({top})", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
