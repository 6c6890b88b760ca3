"""Benchmark workloads: ``specbench``, ``mtbench``, ``humaneval``, ``gsm8k``, and ``jsonl`` with named fields.

| workload | file (``workload.path``) | prompt | id | category (task) |
|---|---|---|---|---|
| ``specbench`` | Spec-Bench ``question.jsonl`` | ``turns`` | ``question_id`` | ``category`` (Spec-Bench's six tasks) |
| ``mtbench`` | MT-Bench ``question.jsonl`` | ``turns`` (two) | ``question_id`` | ``category`` (task ``mt_bench``) |
| ``humaneval`` | ``HumanEval.jsonl(.gz)`` | ``prompt`` | ``task_id`` | ``humaneval`` |
| ``gsm8k`` | ``test.jsonl`` / ``train.jsonl`` | ``question`` | line index | ``gsm8k`` |
| ``jsonl`` | any | ``workload.prompt_field`` | ``workload.id_field`` | ``workload.category_field`` |

A prompt field holding a list of strings is a multi-turn question (one user turn each). Each question's
turn 1 is rendered with the chat template (``workload.chat_template``: ``auto`` | ``none`` | a path, and
``workload.system_prompt``; :mod:`specexp.workloads.chat_template`); later turns are built when the
earlier answers exist (:mod:`specexp.workloads.conversation`). Then, in order: ``workload.categories``
keeps the named categories; prompts longer than ``max_prompt_tokens`` tokens are left out, with a notice;
``workload.num_prompts`` questions are sampled evenly across categories (:mod:`specexp.workloads.selection`).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from specexp.errors import ConfigError
from specexp.workloads.chat_template import load_chat_template
from specexp.workloads.conversation import Conversation, PromptFormat
from specexp.workloads.prompt import Prompt
from specexp.workloads.question_files import RowFormat, read_questions
from specexp.workloads.selection import filter_categories, sample_evenly
from specexp.workloads.tasks import spec_bench_task

_SPEC_BENCH_ROW = {"prompt_field": "turns", "id_field": "question_id", "category_field": "category",
                   "id_required": True, "category_required": True}
FORMATS: dict[str, RowFormat] = {
    "specbench": RowFormat("specbench", **_SPEC_BENCH_ROW),
    "mtbench": RowFormat("mtbench", **_SPEC_BENCH_ROW),
    "humaneval": RowFormat("humaneval", "prompt", id_field="task_id", id_required=True, category="humaneval"),
    "gsm8k": RowFormat("gsm8k", "question", category="gsm8k"),
}
# Workloads whose categories group into Spec-Bench's tasks (metrics.by_task).
TASK_GROUPED = ("specbench", "mtbench")


DATA_DIR_ENV = "SPECEXP_DATA_DIR"


def data_dir() -> Path:
    """Where benchmark files are looked for by default: ``$SPECEXP_DATA_DIR``, else ``../shared/data`` from
    the project's root (they are never shipped with specexp)."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"


def notice(message: str) -> None:
    """One line on stderr that does not stop the run."""
    print(f"specexp: notice: {message}", file=sys.stderr, flush=True)


def row_format(workload: Any) -> RowFormat:
    """The field names of ``workload``'s file: a benchmark's own, or ``jsonl``'s from ``workload.*_field``."""
    if workload.name in FORMATS:
        return FORMATS[workload.name]
    options = workload.options
    return RowFormat(workload.name, prompt_field=options.get("prompt_field") or "prompt",
                     id_field=options.get("id_field") or "id", category_field=options.get("category_field") or "category")


def prompt_format(workload: Any, tokenizer, model_dir: str | Path | None) -> PromptFormat:
    """The chat template and system prompt ``workload`` asks for, for the checkpoint in ``model_dir``."""
    setting = workload.options.get("chat_template", "none")
    template = load_chat_template(setting, model_dir)
    if template is None and setting == "auto":
        where = Path(model_dir).name if model_dir is not None else "the target"
        notice(f"workload {workload.name}: {where} ships no chat template (tokenizer_config.json or"
               " chat_template.jinja): prompts are raw text (workload.chat_template=none says so quietly)")
    return PromptFormat(tokenizer, template, workload.options.get("system_prompt") or None)


def _fits(prompts: list[Prompt], max_prompt_tokens: int | None, workload_name: str) -> list[Prompt]:
    if max_prompt_tokens is None:
        return prompts
    kept = [p for p in prompts if len(p.token_ids) <= max_prompt_tokens]
    if len(kept) < len(prompts):
        left_out = Counter(p.category for p in prompts if len(p.token_ids) > max_prompt_tokens)
        per_category = ", ".join(f"{c}: {n}" for c, n in left_out.items())
        notice(f"workload {workload_name}: {len(prompts) - len(kept)} of {len(prompts)} prompts are longer than"
               f" {max_prompt_tokens} tokens and are left out ({per_category}); raise engine.max_model_len or"
               " set workload.max_prompt_tokens")
    return kept


def benchmark_prompts(workload: Any, path: Path, tokenizer, model_dir: str | Path | None,
                      max_prompt_tokens: int | None = None) -> list[Prompt]:
    """Turn-1 prompts of the questions ``workload`` selects from ``path`` (see the module docstring);
    ``tokenizer``: the target's ``tokenizers.Tokenizer``; ``model_dir``: where its chat template lives."""
    fmt = row_format(workload)
    questions = read_questions(path, fmt)
    questions = filter_categories(questions, workload.options.get("categories"), lambda q: q.category, str(path))
    if not questions:
        return []
    formatter = prompt_format(workload, tokenizer, model_dir)
    grouped = workload.name in TASK_GROUPED
    conversations = [Conversation(q.id, q.turns, q.category, spec_bench_task(q.category) if grouped else None,
                                  formatter) for q in questions]
    prompts = _fits([c.prompt(1, []) for c in conversations], max_prompt_tokens, workload.name)
    return sample_evenly(prompts, workload.num_prompts, workload.seed, lambda p: p.category)


def resolve_max_prompt_tokens(value, max_model_len: int, max_new_tokens: int) -> int | None:
    """``workload.max_prompt_tokens`` as a count or ``None`` (keep every prompt): ``auto`` is the longest prompt
    that leaves room for ``max_new_tokens`` within ``max_model_len``."""
    if value is None:
        return None
    if value == "auto":
        return max(1, max_model_len - max_new_tokens)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"workload.max_prompt_tokens={value!r} is not valid: use auto, null or a count >= 1")
    return value
