"""What every backend's server (``open_server(spec)``: models loaded, engine built once) shares: closing as a
context manager, the target's tokenizer, and the warm-up's token limit."""

from __future__ import annotations

from typing import Self

from tokenizers import Tokenizer


class BackendServer:
    """Base of a backend's server: ``with open_server(spec) as server: ...`` calls :meth:`close` at the end."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release what the server holds (nothing unless a backend says otherwise)."""


def target_tokenizer(spec) -> Tokenizer | None:
    """The target's tokenizer.json of ``spec`` (a RunSpec), None where its checkpoint ships none."""
    path = spec.pair.target.tokenizer_path
    return Tokenizer.from_file(path) if path else None


def warmup_limit(max_new_tokens: int | None, sampling_max_new_tokens: int) -> int:
    """Tokens per warm-up request: ``max_new_tokens`` (None = the workload's), at most the workload's."""
    return min(max_new_tokens or sampling_max_new_tokens, sampling_max_new_tokens)
