"""The ``random`` workload: prompts of uniformly random (non-special) token ids; EOS is ignored so every
request generates exactly ``output_len`` tokens. The usual latency workload."""

from __future__ import annotations

import random

from specexp.errors import ConfigError
from specexp.workloads.prompt import Prompt


def random_prompts(
    tokenizer, vocab_size: int, num_prompts: int | None, input_len: int | None, seed: int
) -> list[Prompt]:
    """``num_prompts`` prompts of ``input_len`` ids drawn uniformly with ``random.Random(seed)`` from
    ``tokenizer``'s vocabulary minus its special tokens (``range(vocab_size)`` if ``tokenizer`` is None).
    ``text`` is the ids' decoding ('' without a tokenizer). No BOS is added."""
    if num_prompts is None or num_prompts < 0:
        raise ConfigError(f"workload.num_prompts={num_prompts}: the random workload needs a count >= 1")
    if input_len is None or input_len < 1:
        raise ConfigError(f"workload.input_len={input_len}: the random workload needs input_len >= 1")
    if tokenizer is None:
        candidates = list(range(vocab_size))
    else:
        special = set(tokenizer.get_added_tokens_decoder())
        candidates = [i for i in range(min(vocab_size, tokenizer.get_vocab_size())) if i not in special]
    rng = random.Random(seed)
    prompts = []
    for n in range(num_prompts):
        ids = tuple(rng.choice(candidates) for _ in range(input_len))
        text = tokenizer.decode(list(ids)) if tokenizer is not None else ""
        prompts.append(Prompt(id=f"random-{n}", text=text, token_ids=ids, category="random"))
    return prompts
