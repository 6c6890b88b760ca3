"""Which corpus a zoo model trains on (``corpus`` in ``conf/zoo/NAME.yaml``) and what ships with it.

- ``stdlib`` (default): the running interpreter's standard library, each file ``<|bos|> file <|eos|>``
  (:mod:`specexp.zoo.corpus`, :mod:`specexp.zoo.data`).
- ``gsm8k``: GSM8K's train split as chat conversations in the zoo's chat template, from ``data_path``
  (:mod:`specexp.zoo.chat_corpus`); the model ships that template in its ``tokenizer_config.json``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CORPORA = ("stdlib", "gsm8k")


@dataclass
class Corpus:
    """Token streams (``int64[num_tokens]``) and what the model card and HF directory say about them.
    ``tokenizer_config``: written as the model's ``tokenizer_config.json`` (``None``: none)."""

    train: torch.Tensor
    held_out: torch.Tensor
    description: str
    split: str
    tokenizer_config: dict | None = None


def load_corpus(spec, tokenizer) -> Corpus:
    """The corpus of the zoo model ``spec`` (:class:`specexp.zoo.spec.ZooModelSpec`), encoded with ``tokenizer``."""
    if spec.corpus == "stdlib":
        from specexp.zoo.corpus import held_out_texts, interpreter_tag, train_texts
        from specexp.zoo.data import token_stream

        max_files = spec.train.corpus_max_files
        return Corpus(token_stream(tokenizer, train_texts(max_files=max_files)),
                      token_stream(tokenizer, held_out_texts(max_files=max_files)),
                      f"{interpreter_tag()} standard library (train split)",
                      "files split by sha1(relative path) % 100 < 5 → held out")
    if spec.corpus == "gsm8k":
        from specexp.zoo import chat_corpus

        train, held_out = chat_corpus.gsm8k_streams(tokenizer, spec.data_path)
        return Corpus(train, held_out, "GSM8K train split (grade_school_math train.jsonl) in the zoo's chat template",
                      chat_corpus.SPLIT_RULE, chat_corpus.tokenizer_config())
    raise ValueError(f"unknown zoo corpus {spec.corpus!r}: expected one of {CORPORA}")
