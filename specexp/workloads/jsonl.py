"""The ``jsonl`` workload: one JSON object per line with a ``prompt`` string and optional ``category`` and
``id`` (default: the line number)."""

from __future__ import annotations

import json
from pathlib import Path

from specexp.errors import ConfigError
from specexp.workloads.prompt import Prompt


def jsonl_prompts(path: Path, tokenizer, num_prompts: int | None) -> list[Prompt]:
    """The first ``num_prompts`` prompts of ``path`` (all if ``None``), encoded as
    ``tokenizer.encode(prompt).ids``. Blank lines are skipped."""
    if not path.is_file():
        raise ConfigError(f"workload file '{path}' not found: set workload.path to an existing jsonl file")
    prompts = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if num_prompts is not None and len(prompts) >= num_prompts:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{line_no}: not valid JSON ({e.msg}): each line needs a 'prompt'") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ConfigError(f"{path}:{line_no}: expected an object with a 'prompt' string")
        text = row["prompt"]
        prompts.append(
            Prompt(
                id=str(row.get("id", line_no - 1)),
                text=text,
                token_ids=tuple(tokenizer.encode(text).ids),
                category=row.get("category"),
            )
        )
    return prompts
