"""Find and check a draft/target pair's checkpoints before any model is loaded.

A model is named by ``pair.target.path`` / ``pair.draft.path`` and found where the native loader finds it
(:func:`specexp.models.loader.resolve_model_dir`: a local directory, a zoo name such as ``tiny-lfm2`` or
``configs/tiny-random-lfm2``, or a hub id already in the local Hugging Face cache; never downloaded).

Both models are checked before either loads: config.json readable and describing a model the native engine
implements (the very check the loader makes, :meth:`specexp.models.ModelConfig.from_hf`, so the two can
never disagree), the weights each gets (``pair.weights``: ``auto`` loads the safetensors a directory holds
and initialises a config-only one at random, ``trained`` requires safetensors, ``random`` forces random
init), every safetensors file whole (:func:`specexp.models.checkpoint_files.check_safetensors`), and a
shared tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from specexp.errors import ConfigError
from specexp.models.checkpoint_files import CheckpointFileError, check_safetensors, find_weight_files
from specexp.models.config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from specexp.specs import ModelSpec

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
__all__ = ["SUPPORTED_ARCHITECTURES", "check_same_tokenizer", "describe_model", "resolve_model_dir", "zoo_names"]


def zoo_names() -> list[str]:
    """Names of the zoo models (directories under ``specexp/zoo`` holding a config.json)."""
    return sorted(str(p.parent.relative_to(ZOO_DIR)) for p in ZOO_DIR.rglob("config.json"))


def resolve_model_dir(source: str, role: str = "model") -> Path:
    """The local directory ``source`` names (see the module docstring); :class:`ConfigError` if none."""
    from specexp.models.loader import resolve_model_dir as loader_resolve

    local = Path(source).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():
        raise ConfigError(f"{role} checkpoint '{source}' has no config.json in {local.resolve()}:"
                          " point pair.*.path at a Hugging Face model directory")
    try:
        return Path(loader_resolve(source)).resolve()
    except FileNotFoundError:
        raise ConfigError(
            f"{role} checkpoint '{source}' not found: not a directory, not a zoo model"
            f" ({', '.join(zoo_names()) or 'none'}), not a hub id in the local Hugging Face cache"
            " (the network is never used)"
        ) from None


def _read_config(config_path: Path, role: str) -> dict:
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{role} checkpoint's {config_path} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{role} checkpoint's {config_path} is not a JSON object")
    return config


def _weights(model_dir: Path, source: str, requested: str, role: str) -> tuple[str, list[Path], str]:
    """(weights the model gets, its safetensors files, a note saying why) for ``pair.weights=requested``."""
    if requested == "random":
        return "random", [], "pair.weights=random"
    try:
        files = find_weight_files(model_dir)
    except CheckpointFileError as e:
        raise ConfigError(f"{role} checkpoint: {e}") from None
    if files:
        return "trained", files, f"{len(files)} safetensors file{'s' if len(files) > 1 else ''} in {model_dir}"
    if any(model_dir.glob("pytorch_model*.bin")):
        raise ConfigError(
            f"{role} checkpoint '{source}' has only pytorch_model*.bin weights in {model_dir}, which specexp does"
            " not read: save it as safetensors (transformers' save_pretrained does) or set pair.weights=random"
        )
    if requested == "trained":
        raise ConfigError(
            f"{role} checkpoint '{source}' has no weight files (*.safetensors) in {model_dir}:"
            " use pair.weights=random (or auto) for a config-only checkpoint"
        )
    return "random", [], f"no *.safetensors in {model_dir}: config only"


def describe_model(source: str, weights: str, role: str = "model") -> ModelSpec:
    """Resolve and check one checkpoint (see the module docstring) without loading it. ``role``
    (``target``/``draft``) names it in errors. :class:`ConfigError` for anything wrong."""
    model_dir = resolve_model_dir(source, role)
    config_path = model_dir / "config.json"
    config = _read_config(config_path, role)
    try:
        model_config = ModelConfig.from_hf(config, str(config_path))
    except UnsupportedModelError as e:
        raise ConfigError(f"{role} checkpoint: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{role} checkpoint's {config_path} lacks or mangles a field ({type(e).__name__}: {e})"
                          ) from None
    got, files, note = _weights(model_dir, source, weights, role)
    for path in files:
        try:
            check_safetensors(path)
        except CheckpointFileError as e:
            raise ConfigError(f"{role} checkpoint: {e}") from None
    architecture = (config.get("architectures") or [_architecture_of(model_config.model_type)])[0]
    tokenizer = model_dir / "tokenizer.json"
    return ModelSpec(
        path=str(model_dir), source=source, architecture=architecture, vocab_size=model_config.vocab_size,
        tokenizer_path=str(tokenizer) if tokenizer.is_file() else None, weights=got, weights_note=note,
        max_position_embeddings=model_config.max_position_embeddings, num_conv_layers=model_config.num_conv_layers,
    )


def _architecture_of(model_type: str) -> str:
    return next(a for a, t in SUPPORTED_ARCHITECTURES.items() if t == model_type)


def check_same_tokenizer(target: ModelSpec, draft: ModelSpec) -> None:
    """:class:`ConfigError` unless draft and target share vocabulary size and (where both ship one)
    tokenizer.json."""
    if draft.vocab_size != target.vocab_size:
        raise ConfigError(
            f"draft vocab ({draft.vocab_size}) != target vocab ({target.vocab_size}):"
            " a draft must share the target's tokenizer"
        )
    if target.tokenizer_path is None or draft.tokenizer_path is None:
        return
    target_tok, draft_tok = Path(target.tokenizer_path), Path(draft.tokenizer_path)
    if target_tok.read_bytes() == draft_tok.read_bytes():
        return
    from tokenizers import Tokenizer

    target_vocab = Tokenizer.from_file(str(target_tok)).get_vocab(with_added_tokens=True)
    draft_vocab = Tokenizer.from_file(str(draft_tok)).get_vocab(with_added_tokens=True)
    if target_vocab != draft_vocab:
        differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        raise ConfigError(
            f"draft tokenizer {draft_tok} differs from target tokenizer {target_tok} ({differing} differing"
            " entries): a draft must share the target's tokenizer"
        )
