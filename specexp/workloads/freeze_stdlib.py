"""Write the frozen stdlib blocks the ``code`` and ``prose`` workloads serve (``specexp/workloads/data/``).

    python -m specexp.workloads.freeze_stdlib [--stdlib DIR] [--out FILE]

Reads the held-out files of this interpreter's stdlib (or ``DIR``) and writes every def/class and
docstring/comment block, per file, with the Python version they came from. Rewriting the shipped file changes
every ``code``/``prose`` prompt: do it only on purpose, and say so in the results it affects.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
from pathlib import Path

from specexp.workloads.stdlib import FROZEN_BLOCKS, WORKLOADS, live_blocks


def freeze(out: Path, stdlib_root: Path | None = None) -> dict:
    """Write ``{"python": version, "code": [[rel_path, [[first, category, text], ...]], ...], "prose": ...}``
    (gzip, deterministic bytes) to ``out``; returns it."""
    data = {"python": platform.python_version()}
    for name in WORKLOADS:
        data[name] = [[rel, [list(b) for b in blocks]] for rel, blocks in live_blocks(name, stdlib_root)]
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    with open(out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as z:
        z.write(raw)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stdlib", type=Path, default=None, help="a stdlib directory (default: this interpreter's)")
    parser.add_argument("--out", type=Path, default=FROZEN_BLOCKS)
    args = parser.parse_args()
    data = freeze(args.out, args.stdlib)
    counts = ", ".join(f"{name}: {sum(len(b) for _, b in data[name])} blocks" for name in WORKLOADS)
    print(f"wrote {args.out} (Python {data['python']}; {counts})")


if __name__ == "__main__":
    main()
