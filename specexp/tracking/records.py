"""The local run record (docs/design.md §5), written atomically (temp file + rename) into the run's directory:
``result.json``, ``outputs.jsonl``, ``steps.parquet``, ``traces.parquet``, ``answers.jsonl``. Analysis reads these
files."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
OUTPUTS_FILE = "outputs.jsonl"
STEPS_FILE = "steps.parquet"
TRACES_FILE = "traces.parquet"
ANSWERS_FILE = "answers.jsonl"
STATUSES = ("ok", "failed", "interrupted")


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    _atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n"))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write one JSON object per line to ``path`` atomically."""
    _atomic(path, lambda tmp: tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows)))


def write_steps(path: Path, steps: list) -> None:
    """Write step rows (dataclasses or dicts) as a parquet table to ``path`` atomically."""
    import pandas as pd

    rows = [dataclasses.asdict(s) if dataclasses.is_dataclass(s) else s for s in steps]
    _atomic(path, lambda tmp: pd.DataFrame(rows).to_parquet(tmp, index=False))


def write_result(run_dir: Path, record: dict) -> Path:
    """Write result.json (``status``, ``error``, ``config``, ``env``, ``metrics``, ...) into ``run_dir``."""
    assert record["status"] in STATUSES, record["status"]
    path = Path(run_dir) / RESULT_FILE
    write_json(path, record)
    return path


def read_result(run_dir: Path) -> dict:
    """The result.json of ``run_dir``."""
    return json.loads((Path(run_dir) / RESULT_FILE).read_text())


def check_writable(run_dir: Path) -> None:
    """Raise OSError unless a file can be created in ``run_dir`` (a probe, removed at once)."""
    probe = Path(run_dir) / f".write-probe.{os.getpid()}"
    try:
        probe.write_text("")
    finally:
        probe.unlink(missing_ok=True)


def archive_previous(run_dir: Path) -> Path | None:
    """Move an earlier attempt's result.json aside (``result.previous.json``) before a run starts again in
    ``run_dir``, so the record there is always this attempt's; returns the new path, None if there was none."""
    path = Path(run_dir) / RESULT_FILE
    if not path.is_file():
        return None
    previous = path.with_name("result.previous.json")
    os.replace(path, previous)
    return previous
