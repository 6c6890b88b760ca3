"""Prefill and decode-step latency of the native models vs transformers on this CPU, same weights.

For each architecture (Llama, LFM2) a random HF checkpoint of one mid-size config is written to a temp dir,
loaded both ways, and timed on one request:
  prefill:     one forward over a `--prompt-len` prompt + logits of the last token;
  decode step: one forward of a single token at context `--prompt-len` + its logits
               (native: paged KV / conv-state caches; transformers: its DynamicCache).
Both paths use the same threads and fp32. Prints a table and writes JSON (`--out`).

    python benchmarks/diagnostics/models_cpu.py [--prompt-len 256] [--decode-steps 32] [--out experiments/runs/models_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from specexp.models import (
    AttentionMetadata,
    ForwardContext,
    ShortConvMetadata,
    allocate_conv_states,
    allocate_kv_caches,
    load_model,
)

COMMON = {"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
          "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 4096,
          "tie_word_embeddings": True}
LFM2_LAYERS = ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "full_attention"]
BLOCK_SIZE = 16


def hf_model(arch: str):
    from transformers import Lfm2Config, Lfm2ForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**COMMON))
    config = Lfm2Config(**COMMON, layer_types=LFM2_LAYERS, conv_L_cache=3, block_auto_adjust_ff_dim=False)
    return Lfm2ForCausalLM(config)


def step_context(model, kv_caches, conv_states, context_len: int, num_new: int, max_blocks: int) -> ForwardContext:
    """Metadata for one request (blocks 1.., conv slot 1) running `num_new` tokens after `context_len`."""
    seq_len = context_len + num_new
    positions = torch.arange(context_len, seq_len)
    block_table = torch.zeros(1, max_blocks, dtype=torch.int32)
    block_table[0] = torch.arange(1, max_blocks + 1)
    qsl = torch.tensor([0, num_new], dtype=torch.int32)
    attn = AttentionMetadata(
        query_start_loc=qsl, seq_lens=torch.tensor([seq_len], dtype=torch.int32), block_table=block_table,
        slot_mapping=(block_table[0].long()[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE),
        token_req_indices=torch.zeros(num_new, dtype=torch.int64), max_seq_len=seq_len, max_query_len=num_new,
        num_actual_tokens=num_new,
    )
    decode = num_new == 1
    has_initial = torch.tensor([context_len > 0])
    conv = ShortConvMetadata(
        num_prefills=0 if decode else 1, num_prefill_tokens=0 if decode else num_new,
        num_decodes=1 if decode else 0, num_decode_tokens=1 if decode else 0, num_spec_decodes=0,
        num_spec_decode_tokens=0, num_actual_tokens=num_new, spec_query_len=1,
        max_prefill_query_len=0 if decode else num_new, query_start_loc=qsl,
        state_indices_tensor=torch.tensor([1], dtype=torch.int32), non_spec_query_start_loc=qsl,
        has_initial_states_d=has_initial if decode else None, has_initial_states_p=None if decode else has_initial,
    )
    return ForwardContext(attn, conv, kv_caches, conv_states)


def interleaved_median_ms(fns: dict, repeats: int, warmup: int = 2) -> dict:
    """Median wall time (ms) of each zero-arg callable, calls interleaved so load from other processes on
    a shared CPU hits every contender alike."""
    times = {name: [] for name in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if i >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: round(statistics.median(t), 2) for name, t in times.items()}


@torch.no_grad()
def bench_arch(arch: str, prompt_len: int, decode_steps: int, prefill_repeats: int) -> dict:
    from transformers import DynamicCache

    reference = hf_model(arch).eval()
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(tmp)
        native = load_model(tmp)
    num_tokens = prompt_len + decode_steps + 2  # + decode warmup
    prompt = torch.randint(3, COMMON["vocab_size"], (num_tokens,), generator=torch.Generator().manual_seed(0))
    max_blocks = -(-num_tokens // BLOCK_SIZE)
    kv = allocate_kv_caches(native, max_blocks + 1, BLOCK_SIZE, "cpu", torch.float32)
    conv = allocate_conv_states(native, 2, 0, "cpu", torch.float32)

    def native_step(context_len: int, num_new: int) -> torch.Tensor:
        ctx = step_context(native, kv, conv, context_len, num_new, max_blocks)
        ids = prompt[context_len:context_len + num_new]
        hidden = native(ids, torch.arange(context_len, context_len + num_new), ctx)
        return native.compute_logits(hidden[-1:])

    prefill = interleaved_median_ms({
        "native": lambda: native_step(0, prompt_len),
        "transformers": lambda: reference(input_ids=prompt[None, :prompt_len], logits_to_keep=1),
    }, prefill_repeats)

    # Decode: both sides extend the prompt by one token per call (context prompt_len, prompt_len + 1, ...).
    native_step(0, prompt_len)
    cache = DynamicCache(config=reference.config)
    reference(input_ids=prompt[None, :prompt_len], past_key_values=cache, use_cache=True, logits_to_keep=1)
    done = {"native": prompt_len, "transformers": prompt_len}

    def native_decode():
        native_step(done["native"], 1)
        done["native"] += 1

    def hf_decode():
        n = done["transformers"]
        reference(input_ids=prompt[None, n:n + 1], past_key_values=cache, use_cache=True)
        done["transformers"] += 1

    decode = interleaved_median_ms({"native": native_decode, "transformers": hf_decode}, decode_steps)
    weight_bytes = sum(p.numel() * p.element_size() for p in native.parameters())
    # Same math: last-token logits of the prompt agree.
    agree = (native_step(0, prompt_len) - reference(input_ids=prompt[None, :prompt_len]).logits[0, -1:]).abs().max()
    return {
        "arch": arch, "params_millions": round(native.num_parameters() / 1e6, 1),
        "prefill_ms": prefill,
        "decode_step_ms": decode,
        "prefill_tokens_per_s": {k: round(prompt_len / v * 1e3) for k, v in prefill.items()},
        # A decode step streams every weight once: weight bytes / step time is the memory bandwidth it reached.
        "decode_weight_gb_per_s": {k: round(weight_bytes / (v * 1e-3) / 1e9, 2) for k, v in decode.items()},
        "max_abs_logit_diff": float(agree),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--prefill-repeats", type=int, default=5)
    parser.add_argument("--arch", choices=["llama", "lfm2", "both"], default="both")
    parser.add_argument("--out", type=Path, default=Path("experiments/runs/models_cpu.json"))
    args = parser.parse_args()
    import transformers

    archs = ["llama", "lfm2"] if args.arch == "both" else [args.arch]
    results = [bench_arch(a, args.prompt_len, args.decode_steps, args.prefill_repeats) for a in archs]
    report = {
        "config": {**COMMON, "lfm2_layer_types": LFM2_LAYERS, "block_size": BLOCK_SIZE, "dtype": "float32",
                   "prompt_len": args.prompt_len, "batch": 1},
        "env": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                "torch": torch.__version__, "transformers": transformers.__version__},
        "results": results,
    }
    print(f"CPU, {torch.get_num_threads()} threads, fp32, batch 1, prompt {args.prompt_len} tokens")
    print(f"{'arch':6} {'params':>7} {'prefill native':>15} {'prefill HF':>11} {'decode native':>14} {'decode HF':>10}")
    for r in results:
        print(f"{r['arch']:6} {r['params_millions']:>6}M {r['prefill_ms']['native']:>12.1f} ms "
              f"{r['prefill_ms']['transformers']:>8.1f} ms {r['decode_step_ms']['native']:>11.2f} ms "
              f"{r['decode_step_ms']['transformers']:>7.2f} ms   weights streamed at "
              f"{r['decode_weight_gb_per_s']['native']:.1f} / {r['decode_weight_gb_per_s']['transformers']:.1f} GB/s"
              f"   (logit diff {r['max_abs_logit_diff']:.1e})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
