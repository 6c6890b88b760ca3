"""Reading benchmark question files: one JSON object a line (``.jsonl``, or gzipped ``.jsonl.gz``).

A :class:`RowFormat` says which fields hold a row's prompt (a string, or a list of strings = the user turns
of a multi-turn question), id and category; :func:`read_questions` turns a file into :class:`Question`
records. A bad line stops the load with one line naming the file, the line number and what is wrong.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specexp.errors import ConfigError


@dataclass(frozen=True)
class RowFormat:
    """Field names of one file format. ``id_field=None`` (or a row without it when not ``id_required``): the
    row's 0-based index among non-blank lines; ``category``: a fixed category for every row (used when
    ``category_field`` is ``None`` or absent from a row)."""

    name: str
    prompt_field: str
    id_field: str | None = None
    category_field: str | None = None
    id_required: bool = False
    category_required: bool = False
    category: str | None = None

    def required(self) -> str:
        fields = [self.prompt_field]
        fields += [self.id_field] if self.id_required and self.id_field else []
        fields += [self.category_field] if self.category_required and self.category_field else []
        return ", ".join(fields)


@dataclass(frozen=True)
class Question:
    """One row: ``turns`` are its user turns (one for single-turn benchmarks); ``line_no`` is 1-based."""

    id: str
    turns: tuple[str, ...]
    category: str | None
    line_no: int


def read_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of ``path`` (gzip when it ends in ``.gz``)."""
    if not path.is_file():
        raise ConfigError(f"workload file '{path}' not found: set workload.path to an existing .jsonl file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise ConfigError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
                yield line_no, row
    except (OSError, EOFError, UnicodeDecodeError) as e:  # e.g. a truncated .gz or a binary file
        raise ConfigError(f"{path}: cannot be read as {'gzipped ' if opener is gzip.open else ''}JSON lines"
                          f" ({type(e).__name__}: {e})") from None


def _turns(value, path: Path, line_no: int, fmt: RowFormat) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        return tuple(value)
    raise ConfigError(f"{path}:{line_no}: field '{fmt.prompt_field}' must be a string or a non-empty list of"
                      f" strings, got {type(value).__name__}")


def read_questions(path: Path, fmt: RowFormat) -> list[Question]:
    """Every row of ``path`` as a :class:`Question` (ids as strings, unique within the file)."""
    questions, seen = [], {}
    for index, (line_no, row) in enumerate(read_rows(path)):
        for field, required in ((fmt.prompt_field, True), (fmt.id_field, fmt.id_required),
                                (fmt.category_field, fmt.category_required)):
            if required and field and field not in row:
                raise ConfigError(f"{path}:{line_no}: missing field '{field}' (a {fmt.name} row needs"
                                  f" {fmt.required()})")
        turns = _turns(row[fmt.prompt_field], path, line_no, fmt)
        qid = str(row[fmt.id_field]) if fmt.id_field and fmt.id_field in row else str(index)
        category = row.get(fmt.category_field) if fmt.category_field else None
        category = fmt.category if category is None else str(category)
        if qid in seen:
            raise ConfigError(f"{path}:{line_no}: id '{qid}' repeats line {seen[qid]}: ids must be unique")
        seen[qid] = line_no
        questions.append(Question(qid, turns, category, line_no))
    return questions
