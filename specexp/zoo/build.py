"""Rebuild the shipped zoo in one go (no Hydra; one process on one GPU machine): train both targets into
``specexp/zoo/``, distill both drafts from them, measure acceptance, render the cards. This replaces the
shipped models; ``python -m specexp train +zoo=NAME`` trains one model into ``experiments/zoo/`` instead.

``python -m specexp.zoo.build [--time-budget-s 70] [--out DIR] [--mix-variant]``

With ``--out``, each finished model directory is also written there as ``<name>.tar`` (plus
``acceptance.json``) as soon as it exists, so a run cut short still returns what it finished.
``--mix-variant`` also distills ``tiny-llama-draft-mix`` (teachers: both targets) into
``outputs/zoo_variants/`` and measures it beside the shipped drafts, as an experiment.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
import time
from pathlib import Path

import torch

from specexp.zoo import DRAFTS, TARGETS, ZOO_DIR
from specexp.zoo.card import write_cards
from specexp.zoo.measure import measure, merge_rows
from specexp.zoo.spec import load_spec
from specexp.zoo.train_loop import train

BUILD_ORDER = ("tiny_llama", "tiny_lfm2", "tiny_llama_draft", "tiny_lfm2_draft")


def export_tar(model_dir: Path, out: Path | None) -> None:
    """Write ``model_dir`` as ``out/<name>.tar`` (to carry trained models off a GPU machine); None: nothing."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / f"{model_dir.name}.tar", "w") as tar:
        tar.add(model_dir, arcname=model_dir.name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-budget-s", type=float, default=None, help="per model training time cap")
    parser.add_argument("--steps", type=int, default=None, help="override every model's steps")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--mix-variant", action="store_true")
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--skip-train", action="store_true", help="only measure and render cards")
    args = parser.parse_args(argv)

    t0 = time.time()
    overrides = {k: v for k, v in {"time_budget_s": args.time_budget_s, "steps": args.steps}.items() if v}
    jobs = [load_spec(name, **overrides) for name in BUILD_ORDER]
    extra_drafts = {}
    if args.mix_variant:
        mix = load_spec("tiny_llama_draft", **overrides)
        mix.name, mix.teachers = "tiny-llama-draft-mix", list(TARGETS)
        mix.out_dir = "outputs/zoo_variants/tiny-llama-draft-mix"
        jobs.append(mix)
        extra_drafts[mix.name] = mix.out_dir
    for spec in jobs if not args.skip_train else []:
        result = train(spec, overwrite_shipped=spec.out_dir is None)  # the four shipped models; variants elsewhere
        export_tar(result.out_dir, args.out)
        print(f"[build] {spec.name} finished at {time.time() - t0:.0f}s", flush=True)

    rows = measure({t: t for t in TARGETS}, {**{d: d for d in DRAFTS}, **extra_drafts},
                   num_prompts=args.num_prompts, new_tokens=args.new_tokens)
    record = ZOO_DIR / "acceptance.json"
    record.write_text(json.dumps(merge_rows(record, rows), indent=1) + "\n")
    if args.out is not None:
        shutil.copyfile(ZOO_DIR / "acceptance.json", args.out / "acceptance.json")
    write_cards()
    print(f"[build] all done in {time.time() - t0:.0f}s (torch {torch.__version__})", flush=True)


if __name__ == "__main__":
    main()
