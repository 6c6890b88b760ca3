"""`--table FILE...` of the benchmark scripts: read earlier result JSON files and print their markdown table."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path


def print_result_tables(parser: argparse.ArgumentParser, files: list[str],
                        render: Callable[[list[tuple[str, dict]]], str]) -> None:
    """Print render([(file name, its JSON), ...]) for `files`; a missing file is the parser's one-line error
    (exit 2) naming it."""
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        parser.error(f"--table: no such file {missing[0]}")
    print(render([(Path(f).name, json.loads(Path(f).read_text())) for f in files]))
