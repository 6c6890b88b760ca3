"""Find and check a draft/target pair's checkpoints before any model is loaded.

A model is named by ``pair.target.path`` / ``pair.draft.path``, looked up in this order:
1. a local directory (``~`` expanded);
2. a zoo name: a directory ``specexp/zoo/<name>/`` holding a config.json (e.g. ``tiny-lfm2``, or
   ``configs/tiny-random-lfm2`` for a config-only model);
3. a hub id already in the local Hugging Face cache (never downloaded).
"""

from __future__ import annotations

import json
from pathlib import Path

from specexp.errors import ConfigError
from specexp.specs import ModelSpec

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
# Architectures specexp's native models implement (the hf backend could run more; comparisons need both).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Lfm2ForCausalLM")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def zoo_names() -> list[str]:
    """Names of the zoo models (directories under ``specexp/zoo`` holding a config.json)."""
    return sorted(str(p.parent.relative_to(ZOO_DIR)) for p in ZOO_DIR.rglob("config.json"))


def _hf_cache_dir(repo_id: str) -> Path | None:
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or not a valid id): the caller reports it
        return None


def resolve_model_dir(source: str) -> Path:
    """The local directory ``source`` names (see the module docstring); :class:`ConfigError` if none."""
    local = Path(source).expanduser()
    if local.is_dir():
        return local.resolve()
    zoo = ZOO_DIR / source
    if (zoo / "config.json").is_file():
        return zoo
    cached = _hf_cache_dir(source)
    if cached is not None:
        return cached
    raise ConfigError(
        f"checkpoint '{source}' not found: not a directory, not a zoo model ({', '.join(zoo_names()) or 'none'}),"
        " not a hub id in the local Hugging Face cache"
    )


def describe_model(source: str, weights: str) -> ModelSpec:
    """Resolve ``source`` and check its files: config.json with a supported architecture, and weight files
    unless ``weights == "random"``. tokenizer.json is optional here (random-token workloads need none);
    text workloads ask for it when they tokenize."""
    model_dir = resolve_model_dir(source)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"checkpoint '{source}' has no config.json in {model_dir}")
    if weights == "trained" and not any(any(model_dir.glob(p)) for p in WEIGHT_PATTERNS):
        raise ConfigError(
            f"checkpoint '{source}' has no weight files (*.safetensors) in {model_dir}:"
            " use pair.weights=random for a config-only checkpoint"
        )
    config = json.loads(config_path.read_text())
    architecture = (config.get("architectures") or ["<none>"])[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(
            f"unsupported architecture '{architecture}' in {config_path}: choose one of"
            f" {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    vocab_size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    tokenizer = model_dir / "tokenizer.json"
    return ModelSpec(
        path=str(model_dir), source=source, architecture=architecture, vocab_size=int(vocab_size),
        tokenizer_path=str(tokenizer) if tokenizer.is_file() else None,
    )


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
