"""CPU-side state of one request: its tokens, cache allocations and speculation bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class RowTrace(NamedTuple):
    """What one step did for one request (a row of traces.parquet): the step's index in its `generate` call,
    the tokens the target ran for it (q), whether they were a prompt chunk, the drafts it could accept (0 for
    a prefill chunk or plain decode), how many of those were accepted, and the tokens it emitted (accepted + 1
    for a row that samples, 0 for a prefill chunk that does not end the prompt; fewer where the request
    stopped inside the step)."""

    step: int
    num_query_tokens: int
    is_prefill: bool
    num_draft_tokens: int
    num_accepted_tokens: int
    num_emitted_tokens: int


@dataclass
class Request:
    """One prompt being served.

    token_ids: prompt + emitted tokens (the committed stream). num_computed_tokens: leading tokens of
    token_ids whose KV / conv state the target has written. While decoding, exactly one committed token
    (the last) is not computed yet: it opens the next verify query.
    num_pending_drafts: drafts proposed at the end of the last step, verified next step. They stay on the device:
    row `draft_row` of the speculator's draft buffer holds them until the next step gathers them.
    pending_token_row: >= 0 while the last token of token_ids is a placeholder (plain-decoding lookahead): the
    token is still on the device, in this row of the in-flight step's sampled tokens.
    num_accepted_tokens: tokens the last verify accepted, bonus included (1 after a prefill) — selects the
    conv window the next step reads.
    acceptance_estimate: the adaptive depth policy's running acceptance of this request
    (`specexp.engine.goodput.AcceptanceEstimate`; None until that policy first sees it).
    """

    request_id: int
    prompt_token_ids: list[int]
    max_new_tokens: int
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    conv_slot: int = 0
    num_pending_drafts: int = 0
    draft_row: int = -1
    pending_token_row: int = -1
    num_accepted_tokens: int = 1
    finished: bool = False
    finish_reason: str | None = None
    # Timing (seconds since the run started). arrival_s: when it reached the engine (`ArrivalGate`);
    # scheduled_s: the first step that ran it (queue = scheduled - arrival).
    arrival_s: float = 0.0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    # Per-verify acceptance of this request: (num_draft_tokens, num_accepted_tokens).
    verifies: list[tuple[int, int]] = field(default_factory=list)
    # Tokens emitted by each step that sampled for this request (Spec-Bench's accept_lengths).
    emitted_per_step: list[int] = field(default_factory=list)
    acceptance_estimate: object | None = None
    # Every step that ran it, in order (prefill chunks included).
    trace: list[RowTrace] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens
