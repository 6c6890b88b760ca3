"""Spec-Bench's answer format: ``answers.jsonl`` of a run, one line per question.

A line is ``{"question_id", "category", "model_id", "choices": [{"index": 0, "turns": [answer text per turn],
"decoding_steps": [steps per turn], "new_tokens": [tokens per turn], "wall_time": [seconds per turn],
"accept_lengths": [tokens emitted by every decoding step, all turns in order]}]}``: Spec-Bench's
evaluation reads ``new_tokens``, ``wall_time`` and ``accept_lengths`` of ``choices[0]``. A turn's wall time is
its request's end-to-end time (arrival to last token; with ``workload.one_at_a_time`` the request ran alone).

:func:`model_id` names what ran, as Spec-Bench's model ids do (model, method, dtype, temperature):
``<target>-vanilla-<backend>-<dtype>-temp-<T>`` without speculation and
``<target>-sps-<draft>-k<k>-<backend>-<dtype>-temp-<T>`` with a draft model ("sps", Spec-Bench's name for
draft-model speculative sampling).
"""

from __future__ import annotations

from pathlib import PurePath


def _model_name(path) -> str:
    return PurePath(str(path)).name or str(path)


def model_id(config: dict) -> str:
    """The Spec-Bench model id of a run from its resolved config (``pair``, ``speculator``, ``backend``,
    ``sampling``)."""
    pair, k = config["pair"], int(config["speculator"]["num_speculative_tokens"])
    method = "vanilla" if k == 0 else f"sps-{_model_name(pair['draft']['path'])}-k{k}"
    backend = config["backend"]["name"] if isinstance(config.get("backend"), dict) else config.get("backend")
    temperature = float(config["sampling"]["temperature"])
    return f"{_model_name(pair['target']['path'])}-{method}-{backend}-{pair['dtype']}-temp-{temperature}"


def _question_id(value: str):
    # Spec-Bench's and MT-Bench's ids are integers; specexp keeps ids as strings.
    return int(value) if value.isdigit() else value


def answers(requests: list, model_id: str) -> list[dict]:
    """One answer line per question of ``requests`` (:class:`specexp.result.RequestOutput`, any order), its
    turns in turn order; questions in the order of their first request."""
    questions: dict[str, list] = {}
    for request in requests:
        questions.setdefault(request.question_id or request.prompt_id, []).append(request)
    lines = []
    for qid, turns in questions.items():
        turns = sorted(turns, key=lambda r: r.turn)
        lines.append({
            "question_id": _question_id(qid),
            "category": turns[0].category,
            "model_id": model_id,
            "choices": [{
                "index": 0,
                "turns": [r.output_text.strip() for r in turns],
                "decoding_steps": [len(r.accept_lengths) for r in turns],
                "new_tokens": [len(r.output_token_ids) for r in turns],
                "wall_time": [_wall_time_s(r) for r in turns],
                "accept_lengths": [n for r in turns for n in r.accept_lengths],
            }],
        })
    return lines


def _wall_time_s(request) -> float | None:
    """A turn's own generation time in seconds, its queueing (``queue_ms``) left out, as Spec-Bench's
    one-request-at-a-time runs measure it; None where the request has no end-to-end time."""
    if request.e2e_ms is None:
        return None
    return (request.e2e_ms - (request.queue_ms or 0.0)) / 1e3
