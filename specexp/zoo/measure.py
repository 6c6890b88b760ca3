"""Measure the zoo's greedy acceptance lengths (every draft against every target, k = 1..8) on the
``code`` and ``prose`` workloads and write ``specexp/zoo/acceptance.json``, which the model cards show.

``python -m specexp.zoo.measure [--num-prompts 128] [--new-tokens 128] [--device cuda]``. Computation is
fp32 with TF32 off, so the numbers match a CPU fp32 run up to rare near-tie argmax flips.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from specexp.workloads.stdlib import build_prompts
from specexp.zoo import DRAFTS, TARGETS, ZOO_DIR, resolve_model_dir
from specexp.zoo.acceptance import acceptance_lengths, greedy_continuation, greedy_continuations_batched
from specexp.zoo.corpus import interpreter_tag
from specexp.zoo.tokenizer import load_tokenizer


def load_fp32(name_or_path: str | Path, device: torch.device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model_dir(name_or_path), dtype=torch.float32).to(device).eval()


def target_continuations(target, prompts_ids: list[list[int]], new_tokens: int, device: torch.device):
    if device.type == "cuda":
        return greedy_continuations_batched(target, prompts_ids, new_tokens, device)
    return [greedy_continuation(target, p, new_tokens, device) for p in prompts_ids]


def measure(targets: dict[str, str | Path], drafts: dict[str, str | Path], workloads=("code", "prose"),
            num_prompts: int = 128, input_len: int = 128, new_tokens: int = 128, ks=tuple(range(1, 9)),
            device: torch.device | None = None) -> list[dict[str, Any]]:
    """Rows ``{target, draft, workload, acceptance_length: {k: AL}, ...}`` for every (target, draft) pair."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokenizer = load_tokenizer()
    compute = f"fp32 on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}"
    draft_models = {name: load_fp32(path, device) for name, path in drafts.items()}
    rows = []
    for workload in workloads:
        prompts = build_prompts(workload, input_len=input_len, num_prompts=num_prompts)
        prompts_ids = [tokenizer.encode(p.text).ids for p in prompts]
        for target_name, target_path in targets.items():
            target = load_fp32(target_path, device)
            t0 = time.time()
            continuations = target_continuations(target, prompts_ids, new_tokens + max(ks), device)
            print(f"[measure] {target_name} on {workload}: {len(prompts)} continuations in {time.time() - t0:.1f}s",
                  flush=True)
            for draft_name, draft in draft_models.items():
                stats = acceptance_lengths(target, draft, prompts_ids, new_tokens, ks, device, continuations)
                row = {
                    "target": target_name, "draft": draft_name, "workload": workload,
                    "num_prompts": len(prompts), "input_len": input_len, "new_tokens": new_tokens,
                    "compute": compute, "interpreter": interpreter_tag(),
                    "acceptance_length": {str(k): round(s.acceptance_length, 4) for k, s in stats.items()},
                    "num_drafts": {str(k): s.num_drafts for k, s in stats.items()},
                    "num_accepted_tokens": {str(k): s.num_accepted_tokens for k, s in stats.items()},
                }
                rows.append(row)
                al = " ".join(f"{s.acceptance_length:.2f}" for s in stats.values())
                print(f"[measure] {target_name} <- {draft_name} on {workload}: AL k=1..{max(ks)}: {al}", flush=True)
    return rows


def merge_rows(path: Path, new_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``path``'s acceptance rows with ``new_rows`` replacing those of the same (target, draft, workload), so
    measuring one set of pairs keeps the others' rows (the chat pair's are measured by
    :mod:`specexp.zoo.build_chat`)."""
    rows = json.loads(path.read_text()) if path.exists() else []
    keys = {(r["target"], r["draft"], r["workload"]) for r in new_rows}
    return [r for r in rows if (r["target"], r["draft"], r["workload"]) not in keys] + new_rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device")
    parser.add_argument("--extra-draft", action="append", default=[], help="NAME=PATH of another draft to measure")
    parser.add_argument("--out", type=Path, default=ZOO_DIR / "acceptance.json")
    args = parser.parse_args(argv)
    drafts = {name: name for name in DRAFTS}
    drafts.update(dict(item.split("=", 1) for item in args.extra_draft))
    rows = measure({t: t for t in TARGETS}, drafts, num_prompts=args.num_prompts, input_len=args.input_len,
                   new_tokens=args.new_tokens, device=torch.device(args.device) if args.device else None)
    args.out.write_text(json.dumps(merge_rows(args.out, rows), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
