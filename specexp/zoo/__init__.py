"""specexp's demo model zoo: tiny trained LFM2 and Llama targets and distilled drafts, in HF format.

``tiny-lfm2`` and ``tiny-llama`` are targets; ``tiny-llama-draft`` and ``tiny-lfm2-draft`` are drafts
distilled from them, all trained on the stdlib corpus. ``tiny-lfm2-gsm8k`` and ``tiny-llama-gsm8k-draft`` are
the chat pair, trained on GSM8K's train split in the zoo's chat template (``chat_template.jinja``, shipped in
their ``tokenizer_config.json``). Each lives in ``specexp/zoo/<name>/`` with ``config.json``, bf16
``model.safetensors``, ``tokenizer.json`` and a model card (``README.md``).
"""

from __future__ import annotations

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
TARGETS = ("tiny-lfm2", "tiny-llama")
DRAFTS = ("tiny-llama-draft", "tiny-lfm2-draft")
# The chat demo pair (GSM8K, the zoo's chat template): built and measured together by specexp.zoo.build_chat.
CHAT_TARGETS = ("tiny-lfm2-gsm8k",)
CHAT_DRAFTS = ("tiny-llama-gsm8k-draft",)
ZOO_MODELS = (*TARGETS, *DRAFTS, *CHAT_TARGETS, *CHAT_DRAFTS)


def is_zoo_name(name: str) -> bool:
    return name in ZOO_MODELS


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """A shipped zoo name → ``specexp/zoo/<name>``; anything else is taken as a local directory."""
    if isinstance(name_or_path, str) and is_zoo_name(name_or_path):
        return ZOO_DIR / name_or_path
    return Path(name_or_path)
