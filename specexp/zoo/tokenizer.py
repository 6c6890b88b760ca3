"""The byte-level BPE tokenizer shared by every demo model.

Vocabulary 4096: three special tokens (ids 0..2, matching the HF config defaults for pad/bos/eos), the
256 byte symbols, and BPE merges learned on the train split of the stdlib corpus. ``encode`` prepends
``<|bos|>`` through the post-processor (docs/design.md §5: the post-processor alone decides special tokens); the
training stream is ``<|bos|> file <|eos|>`` per file, so a prompt looks like the start of a file.
Decoding is byte-exact for any text (byte-level pre-tokenizer, no normalizer, no prefix space).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 4096
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|bos|>", "<|eos|>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SHIPPED_TOKENIZER_PATH = Path(__file__).parent / "tokenizer.json"
"""The tokenizer trained once (on CPython 3.11's stdlib) and copied into every zoo model directory."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Learn a byte-level BPE of ``vocab_size`` tokens (specials included) from ``texts``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", special_tokens=[(BOS_TOKEN, BOS_ID)]
    )
    _check_special_ids(tokenizer)
    return tokenizer


def load_tokenizer(path: str | Path = SHIPPED_TOKENIZER_PATH) -> Tokenizer:
    """Load ``tokenizer.json`` (a file, or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    _check_special_ids(tokenizer)
    return tokenizer


def encode_document(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of one training document: ``<|bos|> text <|eos|>``."""
    return tokenizer.encode(text).ids + [EOS_ID]


def _check_special_ids(tokenizer: Tokenizer) -> None:
    for token, expected_id in ((PAD_TOKEN, PAD_ID), (BOS_TOKEN, BOS_ID), (EOS_TOKEN, EOS_ID)):
        got = tokenizer.token_to_id(token)
        if got != expected_id:
            raise ValueError(f"tokenizer maps {token} to id {got}, expected {expected_id}: not a specexp zoo tokenizer")


def main() -> None:
    """Train the shipped tokenizer on this interpreter's stdlib train split: ``python -m specexp.zoo.tokenizer``."""
    from specexp.zoo.corpus import interpreter_tag, train_texts

    tokenizer = train_tokenizer(train_texts())
    tokenizer.save(str(SHIPPED_TOKENIZER_PATH))
    print(f"wrote {SHIPPED_TOKENIZER_PATH} (vocab {tokenizer.get_vocab_size()}, corpus {interpreter_tag()})")


if __name__ == "__main__":
    main()
