"""Model cards: ``README.md`` in each zoo directory, rendered from its ``training.json`` and the zoo-wide
``acceptance.json`` (greedy acceptance lengths of every draft against every target).

``python -m specexp.zoo.card`` re-renders all four cards from those records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specexp.zoo import ZOO_DIR, ZOO_MODELS

ACCEPTANCE_RECORD = ZOO_DIR / "acceptance.json"

_ROLE = {
    "tiny-lfm2": "target (LFM2: hybrid short-conv + attention)",
    "tiny-llama": "target (Llama)",
    "tiny-llama-draft": "draft (Llama), distilled",
    "tiny-lfm2-draft": "draft (LFM2 hybrid), distilled",
    "tiny-lfm2-gsm8k": "chat target (LFM2: hybrid short-conv + attention)",
    "tiny-llama-gsm8k-draft": "chat draft (Llama), distilled",
}
# What a model writes, by corpus (training.json's "corpus" starts with the corpus's name).
_WRITES = {
    "GSM8K": ("It answers grade-school math word problems in GSM8K's worked-solution style when prompted with\n"
              "its chat template (in `tokenizer_config.json`: `workload.chat_template=auto` applies it)"),
}
_WRITES_DEFAULT = "It writes Python in the style of the standard library and nothing else"
_TOKENIZER_NOTE = {"GSM8K": "; chat template `Question: ... / Answer: ...<|eos|>` in `tokenizer_config.json`"}


def _size_mb(model_dir: Path) -> float:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 1e6


def _acceptance_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_not measured yet_\n"
    ks = sorted({int(k) for row in rows for k in row["acceptance_length"]})
    lines = [
        "| target | draft | workload | " + " | ".join(f"k={k}" for k in ks) + " |",
        "|---|---|---|" + "---|" * len(ks),
    ]
    for row in rows:
        values = " | ".join(f"{row['acceptance_length'][str(k)]:.2f}" for k in ks)
        lines.append(f"| {row['target']} | {row['draft']} | {row['workload']} | {values} |")
    first = rows[0]
    lines.append("")
    lines.append(first.get("description") or (
        f"Greedy acceptance length (tokens emitted per target verify step, bonus token included) at "
        f"depth k, simulated exactly with the HF models: {first['num_prompts']} prompts per workload "
        f"(input_len {first['input_len']} tokens), {first['new_tokens']} new tokens each, EOS ignored, "
        f"{first['compute']}, corpus and prompts from {first['interpreter']}."
    ))
    return "\n".join(lines) + "\n"


def _corpus_kind(training: dict[str, Any]) -> str | None:
    return next((kind for kind in _WRITES if training["corpus"].startswith(kind)), None)


def _reproduce(name: str, training: dict[str, Any]) -> str:
    if _corpus_kind(training) == "GSM8K":
        return f"""```
python -m specexp train +zoo={name.replace('-', '_')} zoo.data_path=PATH/gsm8k/train.jsonl
python -m specexp.zoo.build_chat --data-dir PATH   # what built the shipped pair: both models, acceptance, cards
python -m specexp run +exp=gsm8k                   # the pair on held-out GSM8K test questions, k = 0..8 (CPU)
```
GSM8K (MIT licence) is not part of specexp: PATH holds `gsm8k/train.jsonl` and `gsm8k/test.jsonl`
(openai/grade-school-math). Training is deterministic for a given seed, device and library versions."""
    return f"""```
python -m specexp.zoo.tokenizer            # only to retrain the shared tokenizer (already shipped)
python -m specexp train +zoo={name.replace('-', '_')} zoo.train.steps={training['steps']}
python -m specexp.zoo.build --time-budget-s 50   # what built the shipped zoo: all four, then acceptance + cards
```
Training is deterministic for a given seed, device and library versions; on another Python version
the corpus (and so the weights) differ."""


def _selected(training: dict[str, Any]) -> str:
    selected = training.get("selected_step", training["steps"])
    if selected == training["steps"]:
        return ""
    return f"; shipped weights are step {selected:,}'s, the lowest held-out loss (early stopping)"


def _tokens_seen(training: dict[str, Any]) -> int:
    cfg = training["train"]
    return training.get("selected_step", training["steps"]) * cfg["batch_size"] * cfg["seq_len"]


def render_card(name: str, training: dict[str, Any], acceptance: list[dict[str, Any]], model_dir: Path) -> str:
    """The model card for ``name``; ``acceptance`` rows are those where it is the target or the draft."""
    cfg = training["train"]
    teachers = ", ".join(training["teachers"]) or "none (trained on the corpus)"
    losses = [h for h in training["history"] if "held_out_loss" in h]
    loss_curve = ", ".join(f"{h['step']}: {h['held_out_loss']:.3f}" for h in losses)
    objective = (
        f"{cfg['kl_weight']} x forward KL to the teachers' next-token distribution + "
        f"{1 - cfg['kl_weight']:.2f} x next-token cross-entropy"
        if training["teachers"] else "next-token cross-entropy"
    )
    size_fields = ", ".join(f"{k}={v}" for k, v in training["size"].items())
    return f"""# {name}

A tiny {_ROLE.get(name, training['arch'])} shipped with specexp so that speculative decoding can be
studied offline and on CPU. {_WRITES.get(_corpus_kind(training), _WRITES_DEFAULT)};
it is a research fixture, not a useful language model.

| | |
|---|---|
| architecture | `{training['arch']}` ({size_fields}) |
| parameters | {training['parameters']:,} (tied input/output embeddings) |
| weights | bf16 safetensors, {_size_mb(model_dir):.1f} MB |
| tokenizer | byte-level BPE, vocabulary 4096, shared by all zoo models (`tokenizer.json`; `<|bos|>` prepended){_TOKENIZER_NOTE.get(_corpus_kind(training), '')} |
| corpus | {training['corpus']}: {training['train_stream_tokens']:,} tokens; {training.get('corpus_split', 'files split by sha1(relative path) % 100 < 5 → held out')} |
| distilled from | {teachers} |
| objective | {objective} |
| steps | {training['steps']:,} x batch {cfg['batch_size']} x {cfg['seq_len']} tokens{_selected(training)} |
| tokens seen | {_tokens_seen(training):,} (by the shipped weights) |
| optimizer | AdamW (0.9, 0.95), lr {cfg['lr']} (warm-up {cfg['warmup_steps']}, cosine to {cfg['min_lr_ratio']}x), weight decay {cfg['weight_decay']}, clip {cfg['grad_clip']} |
| held-out loss | {training['held_out_loss']:.4f} nats/token (cross-entropy over {training['held_out_tokens_evaluated']:,} held-out tokens) |
| held-out loss during training | {loss_curve} |
| hardware | {training['hardware']}, {training['train_time_s']:.0f} s |
| seed | {cfg['seed']} |

## Greedy acceptance length

{_acceptance_table(acceptance)}
## Reproduce

{_reproduce(name, training)}
"""


def write_cards(zoo_dir: Path = ZOO_DIR, names: tuple[str, ...] = ZOO_MODELS) -> list[Path]:
    """Render ``README.md`` for each trained model in ``names`` under ``zoo_dir``."""
    acceptance_path = zoo_dir / ACCEPTANCE_RECORD.name
    acceptance = json.loads(acceptance_path.read_text()) if acceptance_path.exists() else []
    written = []
    for name in names:
        model_dir = zoo_dir / name
        training_path = model_dir / "training.json"
        if not training_path.exists():
            continue
        training = json.loads(training_path.read_text())
        rows = [r for r in acceptance if name in (r["target"], r["draft"])]
        (model_dir / "README.md").write_text(render_card(name, training, rows, model_dir))
        written.append(model_dir / "README.md")
    return written


if __name__ == "__main__":
    for path in write_cards():
        print(f"wrote {path}")
