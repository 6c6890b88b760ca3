"""``python -m specexp train +zoo=NAME``: the Hydra entry point of the zoo's training recipe.

The CLI composes ``conf/train.yaml`` with ``conf/zoo/NAME.yaml`` (under ``zoo``) and calls :func:`main`.
All the work is in :mod:`specexp.zoo.train_loop` (plain PyTorch, no Hydra), which
``python -m specexp.zoo.train_loop NAME`` and ``python -m specexp.zoo.build`` also use.

The trained model goes to ``out_dir`` (default ``experiments/zoo/<name>``); the shipped model in
``specexp/zoo/<name>`` is replaced only with ``+overwrite_shipped=true``.
"""

from __future__ import annotations

from typing import Any

from specexp.zoo.spec import REPO_CONF_DIR, spec_from_dict
from specexp.zoo.train_loop import TrainResult, train

# The demo pair (conf/pair) each zoo model is part of, and its role there.
PAIR_OF = {
    "tiny-lfm2": ("tiny_lfm2", "target"),
    "tiny-llama": ("tiny_llama", "target"),
    "tiny-llama-draft": ("tiny_llama", "draft"),
    "tiny-lfm2-draft": ("tiny_lfm2_hybrid", "draft"),
    "tiny-lfm2-gsm8k": ("tiny_gsm8k", "target"),
    "tiny-llama-gsm8k-draft": ("tiny_gsm8k", "draft"),
}


def main(cfg: Any) -> TrainResult:
    """Train the model ``cfg.zoo`` describes (resuming from its checkpoint if there is one)."""
    from omegaconf import OmegaConf

    from specexp.errors import ConfigError

    if cfg.get("zoo") is None or cfg.zoo.get("name") is None:
        names = sorted(p.stem for p in (REPO_CONF_DIR / "zoo").glob("*.yaml"))
        raise ConfigError(f"no zoo model chosen: add +zoo=NAME, one of {', '.join(names)}")
    overwrite = cfg.get("overwrite_shipped", False)
    if not isinstance(overwrite, bool):
        raise ConfigError(f"overwrite_shipped={overwrite!r} is not valid: use true or false")
    zoo = OmegaConf.to_container(cfg.zoo, resolve=True)
    spec = spec_from_dict(zoo, {"out_dir": cfg.get("out_dir"), "ckpt_dir": cfg.get("ckpt_dir")})
    result = train(spec, overwrite_shipped=overwrite)
    if result.finished:
        print(next_steps(spec.name, str(result.out_dir), overwrite))
    return result


def next_steps(name: str, out_dir: str, overwrite_shipped: bool) -> str:
    """The lines printed after training: how to run the new model, or refresh the shipped zoo's cards."""
    if overwrite_shipped:
        return (f"[{name}] replaced the shipped model; refresh the zoo's acceptance table and model cards with "
                f"python -m specexp.zoo.measure && python -m specexp.zoo.card")
    pair, role = PAIR_OF.get(name, ("local", "target"))
    return (f"[{name}] use it: python -m specexp run +exp=quickstart pair={pair} pair.{role}.path={out_dir} "
            f"(the shipped specexp/zoo/{name} is unchanged)")
