"""Free lists of KV-cache blocks and conv-state slots; id 0 of each is the NULL id no request owns."""

from __future__ import annotations

from specexp.models.metadata import NULL_BLOCK_ID


class IdPool:
    """Hands out ids 1..capacity (0 is NULL_BLOCK_ID) lowest first, so runs are reproducible."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = list(range(capacity, NULL_BLOCK_ID, -1))  # pop() takes the lowest

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} ids with {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, ids: list[int]) -> None:
        self._free.extend(ids)
        self._free.sort(reverse=True)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """KV blocks covering `num_tokens` positions."""
    return -(-num_tokens // block_size)
