"""Build the chat demo pair in one go (no Hydra; made for one run on a GPU machine): train ``tiny-lfm2-gsm8k`` on
GSM8K's train split in the zoo's chat template, distill ``tiny-llama-gsm8k-draft`` from it, measure greedy
acceptance on held-out GSM8K test questions, render both model cards.

``python -m specexp.zoo.build_chat [--data-dir DIR] [--out DIR] [--time-budget-s S] [--num-prompts 128]``

``--data-dir`` holds ``gsm8k/train.jsonl`` and ``gsm8k/test.jsonl`` (default ``$SPECEXP_DATA_DIR``, else
``../shared/data`` from the project's root); GSM8K is never part of specexp. Each model is trained into
``outputs/zoo_chat/<name>`` and then copied into ``specexp/zoo/<name>`` (the draft's teacher is read from
there). With ``--out``, each finished model is also written there as ``<name>.tar`` as soon as it exists,
so a run cut short still returns what it finished, and again with its model card at the end, beside
``acceptance.json``.

Acceptance (``acceptance.json``, rows with ``workload: gsm8k``) is simulated exactly with the HF models as
for the rest of the zoo (:mod:`specexp.zoo.acceptance`), with one difference: each answer ends at the
target's EOS, as a served request does, instead of running a fixed number of tokens past it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from specexp.zoo import CHAT_DRAFTS, CHAT_TARGETS, ZOO_DIR
from specexp.zoo.acceptance import acceptance_lengths
from specexp.zoo.measure import merge_rows
from specexp.zoo.tokenizer import EOS_ID

BUILD_ORDER = ("tiny_lfm2_gsm8k", "tiny_llama_gsm8k_draft")
STAGING_DIR = Path("outputs") / "zoo_chat"
TEST_FILE = Path("gsm8k") / "test.jsonl"


def gsm8k_test_prompts(target_dir: Path, test_path: Path, num_prompts: int) -> list[list[int]]:
    """Token ids of ``num_prompts`` GSM8K test questions (sampled with seed 0) in the target's chat template,
    exactly as ``workload=gsm8k workload.chat_template=auto`` serves them."""
    from specexp.specs import WorkloadSpec, group_spec
    from specexp.workloads import load_prompts

    spec = group_spec(WorkloadSpec, {"name": "gsm8k", "path": str(test_path), "num_prompts": num_prompts,
                                     "seed": 0, "chat_template": "auto"})
    prompts = load_prompts(spec, target_dir / "tokenizer.json", 0, model_dir=target_dir)
    return [list(p.token_ids) for p in prompts]


def measure_gsm8k(target: str, draft: str, test_path: Path, num_prompts: int = 128, new_tokens: int = 256,
                  ks=tuple(range(1, 9)), device: torch.device | None = None,
                  zoo_dir: Path = ZOO_DIR) -> dict[str, Any]:
    """The acceptance.json row of ``draft`` speculating for ``target`` (models in ``zoo_dir``) on held-out
    GSM8K test questions."""
    from specexp.zoo.corpus import interpreter_tag
    from specexp.zoo.measure import load_fp32, target_continuations

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    prompts_ids = gsm8k_test_prompts(zoo_dir / target, test_path, num_prompts)
    target_model, draft_model = load_fp32(zoo_dir / target, device), load_fp32(zoo_dir / draft, device)
    continuations = target_continuations(target_model, prompts_ids, new_tokens + max(ks), device)
    stats = acceptance_lengths(target_model, draft_model, prompts_ids, new_tokens, ks, device, continuations,
                               stop_token_ids=(EOS_ID,))
    compute = f"fp32 on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}"
    description = (
        f"Greedy acceptance length (tokens emitted per target verify step, bonus token included) at depth k,"
        f" simulated exactly with the HF models: {len(prompts_ids)} held-out GSM8K test questions (sampled with"
        f" seed 0) in the zoo's chat template, each answer up to its EOS (at most {new_tokens} tokens), {compute}."
        f" On the native engine: `python -m specexp run +exp=gsm8k` (k = 0..8, CPU)."
    )
    return {
        "target": target, "draft": draft, "workload": "gsm8k", "num_prompts": len(prompts_ids), "input_len": None,
        "new_tokens": new_tokens, "stop_at_eos": True, "compute": compute, "interpreter": interpreter_tag(),
        "description": description,
        "acceptance_length": {str(k): round(s.acceptance_length, 4) for k, s in stats.items()},
        "num_drafts": {str(k): s.num_drafts for k, s in stats.items()},
        "num_accepted_tokens": {str(k): s.num_accepted_tokens for k, s in stats.items()},
    }


def main(argv: list[str] | None = None) -> None:
    from specexp.workloads.benchmarks import data_dir
    from specexp.zoo.build import export_tar
    from specexp.zoo.card import write_cards
    from specexp.zoo.spec import load_spec
    from specexp.zoo.train_loop import train

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None, help="holds gsm8k/train.jsonl and gsm8k/test.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="also write each model as <name>.tar here")
    parser.add_argument("--time-budget-s", type=float, default=None, help="per model training time cap")
    parser.add_argument("--steps", type=int, default=None, help="override each model's steps (smoke runs)")
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--skip-train", action="store_true", help="only measure and render the cards")
    parser.add_argument("--zoo-dir", type=Path, default=ZOO_DIR, help="where the models go (default: the zoo)")
    args = parser.parse_args(argv)
    data, zoo_dir = args.data_dir or data_dir(), args.zoo_dir

    t0 = time.time()
    overrides = {k: v for k, v in {"time_budget_s": args.time_budget_s, "steps": args.steps}.items() if v}
    for config in BUILD_ORDER if not args.skip_train else ():
        spec = load_spec(config, **overrides)
        spec.data_path = str(data / "gsm8k" / "train.jsonl")
        spec.out_dir = str(STAGING_DIR / spec.name)
        if zoo_dir != ZOO_DIR:  # teachers are zoo names: read them from the same directory
            spec.teachers = [str(zoo_dir / t) if (zoo_dir / t).is_dir() else t for t in spec.teachers]
        result = train(spec)
        shipped = zoo_dir / spec.name
        shutil.rmtree(shipped, ignore_errors=True)
        shutil.copytree(result.out_dir, shipped)
        print(f"[build_chat] {spec.name} finished at {time.time() - t0:.0f}s", flush=True)

    rows = [measure_gsm8k(target, draft, data / TEST_FILE, args.num_prompts, args.new_tokens, zoo_dir=zoo_dir)
            for target in CHAT_TARGETS for draft in CHAT_DRAFTS]
    for row in rows:
        al = " ".join(f"{v:.2f}" for v in row["acceptance_length"].values())
        print(f"[build_chat] {row['target']} <- {row['draft']} on gsm8k: AL k=1..8: {al}", flush=True)
    record = zoo_dir / "acceptance.json"
    record.write_text(json.dumps(merge_rows(record, rows), indent=1) + "\n")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record, args.out / "acceptance.json")
    write_cards(zoo_dir, names=(*CHAT_TARGETS, *CHAT_DRAFTS))
    for name in (*CHAT_TARGETS, *CHAT_DRAFTS):  # with their model cards
        export_tar(zoo_dir / name, args.out)
    print(f"[build_chat] all done in {time.time() - t0:.0f}s (torch {torch.__version__})", flush=True)


if __name__ == "__main__":
    main()
