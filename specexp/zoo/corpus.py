"""The demo models' corpus: the running interpreter's standard-library ``.py`` sources.

Built at run time, never committed. Files under ``site-packages``/``dist-packages`` and test
directories are left out. Each file is assigned to *train* or *held-out* by a hash of its path relative
to the stdlib root, so the split is the same on every machine running the same Python version, and a file
keeps its side when other files are added or removed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_PERCENT = 5
"""A file is held out when ``sha1(relative path) % 100 < HELD_OUT_PERCENT``."""

_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


@dataclass(frozen=True)
class SourceFile:
    """One stdlib source file: ``rel_path`` uses '/' separators and is the split key."""

    rel_path: str
    path: Path

    def read_text(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


def stdlib_root() -> Path:
    """The directory holding the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def interpreter_tag() -> str:
    """Which stdlib the corpus came from, e.g. ``CPython 3.12.3``; recorded in model cards and run envs."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def is_held_out(rel_path: str) -> bool:
    """True when the file at ``rel_path`` (relative to the stdlib root, '/'-separated) is held out."""
    digest = hashlib.sha1(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELD_OUT_PERCENT


def stdlib_files(root: Path | None = None) -> list[SourceFile]:
    """All corpus files under ``root`` (default: this interpreter's stdlib), sorted by relative path."""
    root = Path(root) if root is not None else stdlib_root()
    found: list[SourceFile] = []
    for dir_path, dir_names, file_names in os.walk(root):
        dir_names[:] = sorted(d for d in dir_names if d not in _SKIPPED_DIRS)
        for name in file_names:
            if name.endswith(".py"):
                path = Path(dir_path) / name
                found.append(SourceFile(path.relative_to(root).as_posix(), path))
    return sorted(found, key=lambda f: f.rel_path)


def split_files(root: Path | None = None) -> tuple[list[SourceFile], list[SourceFile]]:
    """``(train, held_out)`` corpus files, each sorted by relative path."""
    files = stdlib_files(root)
    return [f for f in files if not is_held_out(f.rel_path)], [f for f in files if is_held_out(f.rel_path)]


def train_texts(root: Path | None = None, max_files: int | None = None) -> Iterator[str]:
    """Source text of each train file, in path order (the first ``max_files`` only, if given)."""
    yield from (f.read_text() for f in split_files(root)[0][:max_files])


def held_out_texts(root: Path | None = None, max_files: int | None = None) -> Iterator[str]:
    """Source text of each held-out file, in path order (the first ``max_files`` only, if given)."""
    yield from (f.read_text() for f in split_files(root)[1][:max_files])
