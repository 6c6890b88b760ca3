"""What a command compiles each time it runs: the files it writes into the kernel caches, run after run.

A process that finds every kernel in the on-disk caches starts in seconds; one that compiles starts in tens of
seconds (a reused depth sweep's engine build on an H100: 33.8 s on a fresh machine, 25.6 s the second time,
6.7 s with whole caches, `experiments/2026-12-06-verify-kernels-h100/`). This script runs a command `--runs`
times in a row and, after each run, lists the files written since it started under each cache folder: Triton's
default (`~/.triton/cache`, or TRITON_CACHE_DIR where the environment sets it), inductor's
(TORCHINDUCTOR_CACHE_DIR or `<tmp>/torchinductor_<user>`, its `triton/` subfolder counted apart) and the CUDA
driver's (`~/.nv/ComputeCache`). Each compiled Triton kernel leaves one folder holding `<kernel name>.json`;
their names say which kernels a run compiled. A second run that writes nothing compiled nothing.

    python benchmarks/diagnostics/cache_writes.py --runs 2 --out writes.json -- \\
        python benchmarks/diagnostics/verify_cost.py --pairs llama-3.2-1b+llama-100m --ks 0,1 --out /tmp/v.json

Prints one line per run and writes the JSON after each. Needs nothing but the command's own requirements.
"""

from __future__ import annotations

import argparse
import collections
import getpass
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cache_folders() -> dict[str, Path]:
    """The kernel-cache folders by label, as this environment would place them."""
    inductor = Path(os.getenv("TORCHINDUCTOR_CACHE_DIR")
                    or Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")
    return {"triton": Path(os.getenv("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache"),
            "inductor_triton": inductor / "triton", "inductor": inductor,
            "cuda_driver": Path.home() / ".nv" / "ComputeCache"}


def snapshot(folders: dict[str, Path]) -> dict[Path, int]:
    """Every file under the folders with its modification time (ns)."""
    return {path: path.stat().st_mtime_ns for folder in folders.values() if folder.is_dir()
            for path in folder.rglob("*") if path.is_file()}


def written_since(folders: dict[str, Path], before: dict[Path, int]) -> dict[str, list[Path]]:
    """Files under each folder that are new or changed since the `before` snapshot; a file under two folders
    (inductor's triton/ inside inductor's) counts for the more specific one only."""
    out: dict[str, list[Path]] = {label: [] for label in folders}
    claimed: set[Path] = set()
    for label, folder in sorted(folders.items(), key=lambda kv: -len(str(kv[1]))):
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path not in claimed and before.get(path) != path.stat().st_mtime_ns:
                claimed.add(path)
                out[label].append(path)
    return out


def compiled_kernels(files: list[Path]) -> dict[str, int]:
    """Triton kernels compiled, by name: one `<name>.json` beside its binary in each cache entry (group files,
    `__grp__*.json`, left out)."""
    names = [p.stem for p in files if p.suffix == ".json" and not p.name.startswith("__grp__")]
    return dict(sorted(collections.Counter(names).items()))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if args.runs < 1:
        parser.error(f"--runs={args.runs}: must be at least 1")
    folders = cache_folders()
    result = {"command": command, "folders": {k: str(v) for k, v in folders.items()}, "runs": []}
    for i in range(1, args.runs + 1):
        before = snapshot(folders)
        t0 = time.perf_counter()
        returncode = subprocess.run(command, check=False).returncode
        seconds = time.perf_counter() - t0
        written = written_since(folders, before)
        kernels = compiled_kernels(written["triton"] + written["inductor_triton"])
        run = {"run": i, "returncode": returncode, "seconds": seconds,
               "files_written": {label: len(files) for label, files in written.items()},
               "triton_kernels_compiled": kernels}
        result["runs"].append(run)
        Path(args.out).write_text(json.dumps(result, indent=1))
        counts = ", ".join(f"{label} {n}" for label, n in run["files_written"].items())
        print(f"run {i}: rc={returncode} {seconds:.1f} s; files written: {counts}; "
              f"{sum(kernels.values())} Triton kernels compiled {kernels}", flush=True)
    return result


if __name__ == "__main__":
    sys.exit(0 if all(r["returncode"] == 0 for r in main()["runs"]) else 1)
