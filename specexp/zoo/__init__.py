"""specexp's demo model zoo: tiny trained LFM2 and Llama targets and distilled drafts, in HF format.

``tiny-lfm2`` and ``tiny-llama`` are targets; ``tiny-llama-draft`` and ``tiny-lfm2-draft`` are drafts
distilled from them. Each lives in ``specexp/zoo/<name>/`` with ``config.json``, bf16
``model.safetensors``, ``tokenizer.json`` and a model card (``README.md``).
"""

from __future__ import annotations

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
ZOO_MODELS = ("tiny-lfm2", "tiny-llama", "tiny-llama-draft", "tiny-lfm2-draft")
TARGETS = ("tiny-lfm2", "tiny-llama")
DRAFTS = ("tiny-llama-draft", "tiny-lfm2-draft")


def is_zoo_name(name: str) -> bool:
    return name in ZOO_MODELS


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """A shipped zoo name → ``specexp/zoo/<name>``; anything else is taken as a local directory."""
    if isinstance(name_or_path, str) and is_zoo_name(name_or_path):
        return ZOO_DIR / name_or_path
    return Path(name_or_path)
