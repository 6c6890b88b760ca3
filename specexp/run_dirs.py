"""Run directories: every run (or sweep) claims a directory of its own, atomically, and owns it while it runs.

A directory is *free* when it does not exist or is empty. :func:`claim_run_dir` takes the wanted path, or
the first free ``PATH-1``, ``PATH-2``, ... and marks it with an owner file (``.specexp-owner.json``: host,
pid and the process's start time) created with ``O_EXCL``, so two processes racing for one name (two runs
started in the same second, two array tasks given one directory) never share it. A run releases its
directory when it ends (:func:`release`); an owner file left behind by a killed run is *stale* and does not
block a resume (:func:`take_over`), while a live owner always does.

Nothing here knows about Hydra: the CLI claims the directory and hands its path to Hydra, and a cluster
launcher can call the same functions for each array task.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from pathlib import Path

from specexp.errors import ConfigError

OWNER_FILE = ".specexp-owner.json"
MAX_SUFFIX = 10_000


def hostname() -> str:
    """This machine's name as owner files record it."""
    return socket.gethostname()


def _process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (Linux ``/proc/PID/stat`` field 22), or None
    where it cannot be read; tells a live owner from an unrelated process that reused its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def _owner_record() -> dict:
    return {"pid": os.getpid(), "host": hostname(), "start": _process_start_ticks(os.getpid()),
            "claimed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def owner_of(run_dir: str | Path) -> dict | None:
    """The owner record of ``run_dir`` (``{"pid", "host", "start", "claimed_at"}``), None if it has none."""
    try:
        return json.loads((Path(run_dir) / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_live(owner: dict) -> bool:
    """Whether the process an owner record names still runs. An owner on another host cannot be checked
    from here and counts as live."""
    if owner.get("host") != hostname():
        return True
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    start = owner.get("start")
    return start is None or _process_start_ticks(pid) in (None, start)


def _create_owner_file(run_dir: Path) -> bool:
    """Create ``run_dir``'s owner file exclusively; False if one already exists."""
    try:
        fd = os.open(run_dir / OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(_owner_record(), f)
    return True


def _unwritable(path: Path, error: OSError) -> ConfigError:
    reason = error.strerror or type(error).__name__
    if isinstance(error, (FileExistsError, NotADirectoryError)) or error.errno in (errno.ENOTDIR, errno.EEXIST):
        reason = "a file is in the way"
    return ConfigError(
        f"cannot create the run directory {path} ({reason}): set SPECEXP_RUNS_DIR (or hydra.run.dir /"
        " hydra.sweep.dir) to a directory you can write"
    )


def _try_claim(path: Path) -> bool:
    """Claim ``path`` if it is free: create it (and its parents), then its owner file exclusively."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file of that name
        return False
    except OSError as e:
        raise _unwritable(path, e) from None
    if not path.is_dir():
        return False
    if any(p.name != OWNER_FILE for p in path.iterdir()):
        return False  # holds another run's files
    try:
        return _create_owner_file(path)
    except OSError as e:
        raise ConfigError(
            f"cannot write in the run directory {path} ({e.strerror or type(e).__name__}): set SPECEXP_RUNS_DIR"
            " (or hydra.run.dir / hydra.sweep.dir) to a directory you can write"
        ) from None


def claim_run_dir(wanted: str | Path) -> Path:
    """Claim ``wanted``, or the first free ``wanted-1``, ``wanted-2``, ... ; returns the absolute path claimed.

    Safe against any number of processes claiming the same name at once. :class:`ConfigError` (one line) if
    the directory cannot be created or written.
    """
    wanted = Path(wanted).expanduser().absolute()
    for suffix in range(MAX_SUFFIX):
        candidate = wanted if suffix == 0 else wanted.with_name(f"{wanted.name}-{suffix}")
        if _try_claim(candidate):
            return candidate
    raise ConfigError(f"no free run directory next to {wanted} (tried {MAX_SUFFIX} suffixes)")


def take_over(run_dir: str | Path) -> Path:
    """Own an existing ``run_dir`` to resume it: refused while a live process owns it; a stale owner file
    (its process is gone) is replaced. Returns the absolute path."""
    run_dir = Path(run_dir).expanduser().absolute()
    owner = owner_of(run_dir)
    if owner is not None and is_live(owner):
        where = "" if owner.get("host") == hostname() else f" on host {owner.get('host')}"
        raise ConfigError(
            f"{run_dir} is in use by a live run (pid {owner.get('pid')}{where}): wait for it to end, or delete"
            f" {run_dir / OWNER_FILE} if that run is gone"
        )
    with contextlib.suppress(FileNotFoundError):
        (run_dir / OWNER_FILE).unlink()
    try:
        if not _create_owner_file(run_dir):
            raise ConfigError(f"{run_dir} was claimed by another run just now: try again when it has ended")
    except OSError as e:
        raise ConfigError(f"cannot write in the run directory {run_dir} ({e.strerror}): is it writable?") from None
    return run_dir


def release(run_dir: str | Path) -> None:
    """Give ``run_dir`` up (remove its owner file) if this process owns it."""
    owner = owner_of(run_dir)
    if owner is not None and owner.get("pid") == os.getpid() and owner.get("host") == hostname():
        with contextlib.suppress(OSError):
            (Path(run_dir) / OWNER_FILE).unlink()
