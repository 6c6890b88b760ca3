"""Serving multi-turn conversations: which requests go to the engine together, and in what order.

A turn's prompt holds the model's own answers to the turns before it, so turn ``n`` of a conversation can
start only once turn ``n-1`` has finished. Backends hand :func:`serve_by_turn` a function that serves one
*wave* of prompts (all arriving together, as the engine's ``generate`` does) and get every request back:

- default: wave 1 is turn 1 of every conversation (single-turn prompts included), wave 2 is turn 2 of every
  conversation that has one, and so on. Requests of one wave are batched; a conversation's next turn waits
  for the whole wave (the engine has no call to add a request mid-run).
- ``one_at_a_time`` (``workload.one_at_a_time``): each request is a wave of its own, conversation by
  conversation (q1 turn 1, q1 turn 2, q2 turn 1, ...): Spec-Bench's protocol, where each turn's wall time is
  its own.

A later turn that would not fit (its prompt plus ``max_new_tokens`` over ``max_model_len``) is left out,
with one notice line for the run.

:class:`TurnProgress` turns the waves' progress into one run's: requests done across waves, out of every turn
of every conversation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from specexp.engine.progress import RUN, ProgressCallback, ProgressEvent
from specexp.workloads.benchmarks import notice
from specexp.workloads.prompt import Prompt

T = TypeVar("T")


def serve_by_turn(
    prompts: Sequence[Prompt],
    serve_wave: Callable[[list[Prompt]], Sequence[T]],
    answer_of: Callable[[T], str],
    max_model_len: int | None = None,
    max_new_tokens: int = 0,
    one_at_a_time: bool = False,
) -> list[tuple[Prompt, T]]:
    """Serve ``prompts`` (turn 1 of each conversation) and every later turn; returns ``(prompt, result)``
    for every request served, in conversation order then turn order.

    ``serve_wave(prompts) -> results`` (one per prompt, same order) serves requests that arrive together;
    ``answer_of(result)`` is the answer text the next turn quotes (:func:`specexp.workloads.conversation.answer_text`)."""
    served: dict[int, list[tuple[Prompt, T]]] = {i: [] for i in range(len(prompts))}
    left_out = []

    def fits(prompt: Prompt) -> bool:
        if max_model_len is None or len(prompt.token_ids) + max_new_tokens <= max_model_len:
            return True
        left_out.append(prompt)
        return False

    def next_prompt(index: int) -> Prompt | None:
        prompt, _ = served[index][-1]
        if prompt.turn >= prompt.num_turns:
            return None
        following = prompt.follow_up([answer_of(result) for _, result in served[index]])
        return following if following is not None and fits(following) else None

    if one_at_a_time:
        for index, prompt in enumerate(prompts):
            while prompt is not None:
                served[index].append((prompt, serve_wave([prompt])[0]))
                prompt = next_prompt(index)
    else:
        wave = list(enumerate(prompts))
        while wave:
            results = serve_wave([prompt for _, prompt in wave])
            for (index, prompt), result in zip(wave, results, strict=True):
                served[index].append((prompt, result))
            wave = [(index, p) for index, _ in wave if (p := next_prompt(index)) is not None]
    if left_out:
        notice(f"{len(left_out)} later turns left out: their prompts plus {max_new_tokens} new tokens exceed"
               f" engine.max_model_len={max_model_len} ({', '.join(p.request_id for p in left_out[:5])}"
               f"{', ...' if len(left_out) > 5 else ''})")
    return [pair for index in range(len(prompts)) for pair in served[index]]


class TurnProgress:
    """RUN events of a whole run served in waves: ``done`` counts requests finished in every wave so far,
    ``total`` is every turn of every conversation of ``prompts`` (lowered at :meth:`finish` when later turns
    were left out). ``progress`` None: does nothing."""

    def __init__(self, progress: ProgressCallback | None, prompts: Sequence[Prompt]) -> None:
        self.progress = progress
        self.total = sum(p.num_turns for p in prompts)
        self.done, self.output_tokens, self.t0 = 0, 0, time.perf_counter()

    def _send(self, done: int, output_tokens: int) -> None:
        if self.progress is not None:
            self.progress(ProgressEvent(RUN, done, self.total, time.perf_counter() - self.t0, output_tokens))

    def start(self) -> None:
        """The run's first event (nothing done)."""
        self._send(0, 0)

    def wave(self) -> ProgressCallback | None:
        """A callback for one wave's own RUN events (the engine's ``generate(progress=...)``), reported as
        the run's; None when there is no progress to report."""
        if self.progress is None:
            return None

        def forward(event: ProgressEvent) -> None:
            if event.phase == RUN:
                self._send(self.done + event.done, self.output_tokens + event.output_tokens)
            else:
                self.progress(event)

        return forward

    def served(self, num_requests: int, output_tokens: int, report: bool = False) -> None:
        """Count a finished wave (or request); ``report``: also send the event (when the wave sent none)."""
        self.done += num_requests
        self.output_tokens += output_tokens
        if report:
            self._send(self.done, self.output_tokens)

    def finish(self) -> None:
        """The last event: every request served (the total lowered to it if turns were left out)."""
        if self.done != self.total:
            self.total = self.done
            self._send(self.done, self.output_tokens)
