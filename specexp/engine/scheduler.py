"""Continuous batching: which requests run this step, and how many tokens each.

Rows are ordered decodes/verifies first, then prefill chunks (vLLM's "reorder batch"). A request reserves
the KV blocks of its whole lifetime when it is admitted (prompt + max_new_tokens, plus the slots the draft
may write past the last verified token), so a running request never runs out of blocks and nothing is
ever preempted; a request waits while the pool is short, and one that could never fit is an error.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from specexp.engine.cache_pool import IdPool, blocks_needed
from specexp.engine.config import EngineConfigError
from specexp.engine.request import Request


@dataclass
class ScheduledRow:
    """One request's share of a step.

    num_query_tokens: tokens the target runs for it (q): a verify row's last token and every draft it holds
    (up to k), a prefill chunk's prompt tokens. num_draft_tokens: the drafts it may accept (0 for a prefill
    chunk or a plain decode). Near max_new_tokens or max_model_len that is fewer than q - 1: the row still
    scores all its drafts, so a batch of verify rows stays uniform (k + 1 tokens each, a captured graph), and
    accepts no more than the request may still emit. samples: the row emits tokens this step (every
    decode/verify row, and the chunk that ends the prompt).
    """

    request: Request
    num_query_tokens: int
    num_draft_tokens: int
    is_prefill: bool
    samples: bool

    @property
    def start_position(self) -> int:
        return self.request.num_computed_tokens


@dataclass
class ScheduledBatch:
    """A step's rows, and its k (`num_speculative_tokens`, `specexp.engine.depth`): its verify rows carry at
    most k drafts and the speculator proposes k per row."""

    rows: list[ScheduledRow]
    num_speculative_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(r.num_query_tokens for r in self.rows)

    @property
    def num_reqs(self) -> int:
        return len(self.rows)


class Scheduler:
    """Admits waiting requests and splits each step's token budget.

    num_spec_tokens: K, the most drafts a step may verify or propose. max_blocks_per_req: block-table width.
    Lookahead slots: with a draft, a step may write draft KV up to 2K positions past the last committed token
    (K+2-slot draft prefill, then K-1 decode steps), so each request reserves 2K+1 extra positions.
    step_depth(rows): the step's k in 0..K once its rows are chosen (`specexp.engine.depth`); None = K.
    """

    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_model_len: int,
        token_budget: int,
        block_size: int,
        num_spec_tokens: int,
        block_pool: IdPool,
        slot_pool: IdPool,
        step_depth: Callable[[list[ScheduledRow]], int] | None = None,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.k = num_spec_tokens
        self.lookahead_tokens = 2 * num_spec_tokens + 1 if num_spec_tokens > 0 else 0
        # Every running request can always verify its k drafts in one step.
        self.token_budget = max(token_budget, max_num_seqs * (num_spec_tokens + 1))
        self.block_pool = block_pool
        self.slot_pool = slot_pool
        self.step_depth = step_depth
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def max_blocks_per_req(self) -> int:
        return blocks_needed(self.max_model_len + self.lookahead_tokens, self.block_size)

    def _reserved_tokens(self, request: Request) -> int:
        final_len = min(request.num_prompt_tokens + request.max_new_tokens, self.max_model_len)
        return final_len + self.lookahead_tokens

    def check(self, request: Request) -> None:
        """EngineConfigError unless `request` can ever run: a prompt shorter than max_model_len, not empty,
        whose lifetime's KV blocks fit the whole cache."""
        if request.num_prompt_tokens >= self.max_model_len:
            raise EngineConfigError(
                f"prompt {request.request_id} has {request.num_prompt_tokens} tokens: engine.max_model_len="
                f"{self.max_model_len} must exceed it (room for at least one output token)"
            )
        if request.num_prompt_tokens == 0:
            raise EngineConfigError(f"prompt {request.request_id} is empty: every prompt needs at least one token")
        need = blocks_needed(self._reserved_tokens(request), self.block_size)
        if need > self.block_pool.capacity:
            raise EngineConfigError(
                f"prompt {request.request_id} needs {need} KV blocks but the cache has {self.block_pool.capacity}: "
                f"raise engine.num_kv_blocks or lower max_new_tokens / max_model_len"
            )

    def add(self, request: Request) -> None:
        """Queue an arrived request (checked by `check`); it runs once a batch slot and its blocks are free."""
        self.check(request)
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            need = blocks_needed(self._reserved_tokens(request), self.block_size)
            if need > self.block_pool.num_free or self.slot_pool.num_free == 0:
                break  # wait for running requests to finish and free their blocks
            self.waiting.popleft()
            request.block_ids = self.block_pool.allocate(need)
            request.conv_slot = self.slot_pool.allocate(1)[0]
            self.running.append(request)

    def schedule(self) -> ScheduledBatch:
        """Rows for the next step: every decoding request (1 + its drafts), then prefill chunks in arrival
        order while the token budget lasts."""
        self._admit()
        budget = self.token_budget
        decode_rows: list[ScheduledRow] = []
        prefill_rows: list[ScheduledRow] = []
        for request in self.running:
            if request.is_prefilling:
                continue
            num_scored = min(request.num_pending_drafts, self.k)
            num_acceptable = min(
                num_scored,
                request.max_new_tokens - request.num_output_tokens - 1,
                self.max_model_len - len(request.token_ids) - 1,
            )
            decode_rows.append(ScheduledRow(request, 1 + num_scored, max(num_acceptable, 0), is_prefill=False,
                                            samples=True))
            budget -= 1 + num_scored
        for request in self.running:
            if not request.is_prefilling or budget <= 0:
                continue
            remaining = request.num_prompt_tokens - request.num_computed_tokens
            chunk = min(remaining, budget)
            prefill_rows.append(ScheduledRow(request, chunk, 0, is_prefill=True, samples=chunk == remaining))
            budget -= chunk
        rows = decode_rows + prefill_rows
        # The step's k, looked up by the rows scheduled (prefill chunks included): verify rows carry at most k.
        k = self.step_depth(rows) if self.step_depth is not None else self.k
        for row in decode_rows:
            row.num_query_tokens = min(row.num_query_tokens, 1 + k)
            row.num_draft_tokens = min(row.num_draft_tokens, k)
        return ScheduledBatch(rows, k)

    def finish(self, request: Request) -> None:
        self.running.remove(request)
        self.block_pool.free(request.block_ids)
        self.slot_pool.free([request.conv_slot])
        request.block_ids = []
