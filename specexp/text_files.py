"""Text input files (prompt sets) checked before they are read: a file that is not UTF-8 is named with the
line and byte where it stops being UTF-8, instead of a bare ``UnicodeDecodeError`` from deep inside a loader."""

from __future__ import annotations

from pathlib import Path

from specexp.errors import ConfigError

# Suffixes read as text; other files (parquet, archives) are left to their loaders.
TEXT_SUFFIXES = (".jsonl", ".json", ".txt", ".csv", ".tsv", ".md", ".yaml", ".yml")


def first_non_utf8(path: Path) -> tuple[int, int, int] | None:
    """``(line, column, byte)`` of the first byte of ``path`` that is not UTF-8 (1-based line and column,
    the column counted in bytes), or None if the whole file decodes."""
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return line_no, e.start + 1, line[e.start]
    return None


def check_utf8(path: str | Path, what: str) -> None:
    """:class:`ConfigError` naming ``what`` (e.g. ``workload.path``), the file, line and byte, if a text file
    at ``path`` is not UTF-8. Missing files and non-text suffixes are left to the caller."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() not in TEXT_SUFFIXES:
        return
    bad = first_non_utf8(path)
    if bad is not None:
        line, column, byte = bad
        raise ConfigError(
            f"{what} file {path} is not UTF-8: line {line}, byte {column} is 0x{byte:02x}: save it as UTF-8"
        )
