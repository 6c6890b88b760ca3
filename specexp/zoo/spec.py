"""What one zoo model's recipe is: plain dataclasses, built from ``conf/train.yaml`` + ``conf/zoo/NAME.yaml``.

No Hydra here: the GPU machine has none, so ``specexp.zoo.build`` reads the same YAML files with PyYAML
and ``specexp.zoo.recipe`` (the Hydra entry point) passes its composed config as a plain dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping for one model. Step counts are optimizer steps."""

    steps: int = 1000
    batch_size: int = 64
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    kl_weight: float = 0.9
    """Distillation only: loss = kl_weight * KL(teacher || student) + (1 - kl_weight) * CE."""
    seed: int = 0
    device: str = "auto"
    """``auto`` (cuda if available), ``cpu`` or ``cuda``. On CUDA the step runs under bf16 autocast."""
    log_every_steps: int = 50
    eval_every_steps: int = 500
    eval_windows: int = 256
    checkpoint_every_steps: int = 500
    stop_after_steps: int | None = None
    """Stop (as if interrupted) once this step is checkpointed; for tests and time-boxed runs."""
    corpus_max_files: int | None = None
    """Use only the first N train/held-out files (smoke tests)."""
    progress: bool = True
    keep_best: bool = False
    """Ship the weights of the evaluation with the lowest held-out loss (early stopping), not the last."""
    time_budget_s: float | None = None
    """If set, after the first steps lower ``steps`` so the run fits in this many seconds (recorded)."""


@dataclass
class ZooModelSpec:
    """One shipped model: its name (= directory under ``specexp/zoo/``), architecture, size and recipe."""

    name: str
    arch: str
    size: dict[str, Any]
    teachers: list[str] = field(default_factory=list)
    """Names (or paths) of the models it is distilled from; empty for a target trained on the corpus."""
    train: TrainConfig = field(default_factory=TrainConfig)
    corpus: str = "stdlib"
    """What it trains on: ``stdlib`` or ``gsm8k`` (:mod:`specexp.zoo.corpora`)."""
    data_path: str | None = None
    """The corpus file where the corpus needs one (``gsm8k``: GSM8K's train.jsonl); ``None`` = its default."""
    out_dir: str | None = None
    """Final HF directory; default ``specexp/zoo/<name>``."""
    ckpt_dir: str | None = None
    """Resumable checkpoints; default ``outputs/zoo_ckpt/<name>``."""


def spec_from_dict(zoo: dict[str, Any], run: dict[str, Any] | None = None) -> ZooModelSpec:
    """Build a spec from a zoo config dict; ``run`` (conf/train.yaml's keys) overrides ``zoo.train`` fields
    it names under ``train`` and sets ``out_dir``/``ckpt_dir`` when given."""
    run = run or {}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    train_values = {**dict(zoo.get("train") or {}), **dict(run.get("train") or {})}
    unknown = set(train_values) - train_fields
    if unknown:
        raise ValueError(f"unknown train settings {sorted(unknown)}: expected some of {sorted(train_fields)}")
    return ZooModelSpec(
        name=zoo["name"],
        arch=zoo["arch"],
        size=dict(zoo["size"]),
        teachers=list(zoo.get("teachers") or []),
        train=TrainConfig(**train_values),
        corpus=zoo.get("corpus") or "stdlib",
        data_path=run.get("data_path") or zoo.get("data_path"),
        out_dir=run.get("out_dir") or zoo.get("out_dir"),
        ckpt_dir=run.get("ckpt_dir") or zoo.get("ckpt_dir"),
    )


def load_spec(config_name: str, conf_dir: Path = REPO_CONF_DIR, **train_overrides: Any) -> ZooModelSpec:
    """``conf/zoo/<config_name>.yaml`` as a spec, with ``train_overrides`` applied (no Hydra needed)."""
    import yaml

    zoo = yaml.safe_load((conf_dir / "zoo" / f"{config_name}.yaml").read_text())
    return spec_from_dict(zoo, {"train": train_overrides})
