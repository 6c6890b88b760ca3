"""``python -m specexp train +zoo=NAME``: the Hydra entry point of the zoo's training recipe.

The CLI composes ``conf/train.yaml`` with ``conf/zoo/NAME.yaml`` (under ``zoo``) and calls :func:`main`.
All the work is in :mod:`specexp.zoo.train_loop` (plain PyTorch, no Hydra), which
``python -m specexp.zoo.train_loop NAME`` and ``python -m specexp.zoo.build`` also use.
"""

from __future__ import annotations

from typing import Any

from specexp.zoo.spec import REPO_CONF_DIR, spec_from_dict
from specexp.zoo.train_loop import TrainResult, train


def main(cfg: Any) -> TrainResult:
    """Train the model ``cfg.zoo`` describes (resuming from its checkpoint if there is one)."""
    from omegaconf import OmegaConf

    from specexp.errors import ConfigError

    if cfg.get("zoo") is None or cfg.zoo.get("name") is None:
        names = sorted(p.stem for p in (REPO_CONF_DIR / "zoo").glob("*.yaml"))
        raise ConfigError(f"no zoo model chosen: add +zoo=NAME, one of {', '.join(names)}")
    zoo = OmegaConf.to_container(cfg.zoo, resolve=True)
    spec = spec_from_dict(zoo, {"out_dir": cfg.get("out_dir"), "ckpt_dir": cfg.get("ckpt_dir")})
    result = train(spec)
    if result.finished:
        print(f"[{spec.name}] next: python -m specexp.zoo.measure && python -m specexp.zoo.card")
    return result
