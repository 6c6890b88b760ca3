"""The chat demo pair's corpus: GSM8K's train split rendered with the zoo's own chat template.

Each ``{question, answer}`` of GSM8K's ``train.jsonl`` becomes one conversation, a user turn (the question)
and an assistant turn (the worked solution ending ``#### N``), rendered with ``chat_template.jinja``:

    <|bos|>Question: Natalia sold clips to 48 of her friends ...
    Answer: Natalia sold 48/2 = <<48/2=24>>24 clips in May. ... #### 72<|eos|>

and encoded without the post-processor (the template writes BOS), exactly as a prompt rendered by
``workload.chat_template=auto`` is (:mod:`specexp.workloads.chat_template`), so a model trained on it is
prompted at run time with the format it learned. The template ships in the models' ``tokenizer_config.json``.

The file is never part of specexp: ``data_path`` names it (default ``$SPECEXP_DATA_DIR/gsm8k/train.jsonl``,
``../shared/data`` from the project's root). Questions are split into train and held-out by
``sha1(question) % 100 < 5``, so GSM8K's test split stays unseen for measuring acceptance.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from specexp.errors import ConfigError
from specexp.workloads.benchmarks import data_dir
from specexp.workloads.chat_template import ChatTemplate
from specexp.workloads.question_files import read_rows
from specexp.zoo.tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN

CHAT_TEMPLATE_PATH = Path(__file__).resolve().parent / "chat_template.jinja"
TRAIN_FILE = Path("gsm8k") / "train.jsonl"
HELD_OUT_PERCENT = 5
SPLIT_RULE = f"questions split by sha1(question) % 100 < {HELD_OUT_PERCENT} → held out"


def chat_template() -> ChatTemplate:
    """The zoo's chat template with the zoo tokenizer's special tokens."""
    return ChatTemplate(CHAT_TEMPLATE_PATH.read_text(encoding="utf-8"), str(CHAT_TEMPLATE_PATH),
                        {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN})


def tokenizer_config() -> dict:
    """``tokenizer_config.json`` of a chat model: the template and the special tokens it uses (what
    ``workload.chat_template=auto`` and transformers' ``apply_chat_template`` read)."""
    template = chat_template()
    return {"tokenizer_class": "PreTrainedTokenizerFast", **template.special_tokens,
            "chat_template": template.template}


def default_data_path() -> Path:
    return data_dir() / TRAIN_FILE


def gsm8k_pairs(path: str | Path | None) -> list[tuple[str, str]]:
    """``(question, answer)`` of every row of GSM8K's ``train.jsonl`` at ``path`` (default
    :func:`default_data_path`). A bad row is a one-line :class:`ConfigError` naming the file and line."""
    path = Path(path).expanduser() if path else default_data_path()
    if not path.is_file():
        raise ConfigError(f"GSM8K train file {path} not found: set zoo.data_path to GSM8K's train.jsonl"
                          " (grade_school_math/data/train.jsonl)")
    pairs = []
    for line_no, row in read_rows(path):
        for field in ("question", "answer"):
            if not isinstance(row.get(field), str):
                raise ConfigError(f"{path}:{line_no}: missing field '{field}' (a GSM8K row needs question, answer)")
        pairs.append((row["question"], row["answer"]))
    return pairs


def is_held_out(question: str) -> bool:
    digest = hashlib.sha1(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELD_OUT_PERCENT


def conversation_stream(tokenizer, pairs: list[tuple[str, str]]) -> torch.Tensor:
    """``int64[num_tokens]``: every pair rendered as one conversation with :func:`chat_template`, encoded
    without the post-processor, concatenated in order."""
    template = chat_template()
    texts = [template.render([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                             add_generation_prompt=False) for q, a in pairs]
    ids = [i for encoding in tokenizer.encode_batch(texts, add_special_tokens=False) for i in encoding.ids]
    return torch.tensor(ids, dtype=torch.int64)


def gsm8k_streams(tokenizer, path: str | Path | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, held_out)`` token streams of GSM8K's train split (see the module docstring)."""
    pairs = gsm8k_pairs(path)
    train = [p for p in pairs if not is_held_out(p[0])]
    held_out = [p for p in pairs if is_held_out(p[0])]
    return conversation_stream(tokenizer, train), conversation_stream(tokenizer, held_out)
