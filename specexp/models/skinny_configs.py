"""The skinny kernel's block shapes tuned for one GPU model, per weight shape.

:func:`specexp.models.triton_gemv.skinny_config` picks a (BLOCK_N, BLOCK_K, num_warps, num_stages) from the output
width alone, a rule tuned on an H200. Other cards prefer other tiles for some shapes, so a GPU model may ship a
table of its own: `kernel_configs/skinny_<device>.json` beside this module, `<device>` the CUDA device's name in
lower case with every run of other characters than letters and digits as one `_` ("NVIDIA H100 80GB HBM3" ->
`skinny_nvidia_h100_80gb_hbm3.json`). `benchmarks/diagnostics/tune_skinny.py` measures and writes one; a weight
shape it does not list keeps the rule's tile.

A table holds `{"device": name, "element_bytes": 2, "configs": [{"n": N, "k": K, "config": [BLOCK_N, BLOCK_K,
num_warps, num_stages]}, ...], ...}` (other keys record how it was measured). Its tiles apply to products of that
element size only. An entry with `"kernel": "gate_up_silu"` is that kernel's ([2I, K] weight; BLOCK_N counts gate
rows, each tile holding as many up rows); others are the skinny product's (`"kernel": "skinny"`).

`SPECEXP_SKINNY_CONFIGS` overrides where tables come from: `default` ignores every table (the rule alone), a
directory path is searched instead of `kernel_configs/`. It is read at each lookup (a launch outside a graph); each
table file once per process.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import torch

from specexp.models import triton_support

TABLE_DIR = Path(__file__).with_name("kernel_configs")
ENV_VAR = "SPECEXP_SKINNY_CONFIGS"


def device_slug(device_name: str) -> str:
    """A GPU model's name as a file-name part: lower case, each run of non-alphanumerics one `_`, none at the ends
    ("NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3")."""
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


def table_path(device_name: str, directory: Path = TABLE_DIR) -> Path:
    """Where the table of GPU model `device_name` lives in `directory`."""
    return directory / f"skinny_{device_slug(device_name)}.json"


KERNELS = {"skinny": 16, "gate_up_silu": 8}  # kernel -> its least BLOCK_N (a tensor-core tile of 16 weight rows)


def parse_table(data: dict, source: str) -> dict[tuple[str, int, int, int], tuple[int, int, int, int]]:
    """{(kernel, N, K, element bytes): (BLOCK_N, BLOCK_K, num_warps, num_stages)} from a table's JSON object;
    ValueError naming `source` and the bad entry where its kernel is unknown or its config is not three powers of
    two (BLOCK_N at least the kernel's KERNELS entry, BLOCK_K >= 16) and a positive num_stages."""
    element_bytes = data.get("element_bytes", 2)
    table = {}
    for entry in data.get("configs", []):
        kernel = entry.get("kernel", "skinny")
        config = tuple(entry.get("config", ()))
        ok = (kernel in KERNELS and len(config) == 4 and all(isinstance(v, int) and v > 0 for v in config)
              and all(v & (v - 1) == 0 for v in config[:3]) and config[0] >= KERNELS[kernel] and config[1] >= 16)
        if not ok or not isinstance(entry.get("n"), int) or not isinstance(entry.get("k"), int):
            raise ValueError(f"{source}: skinny config entry {entry} is not {{'kernel': one of {sorted(KERNELS)}, "
                             "'n': int, 'k': int, 'config': [BLOCK_N, BLOCK_K >= 16, num_warps (powers of 2), "
                             "num_stages >= 1]}")
        table[(kernel, entry["n"], entry["k"], element_bytes)] = config
    return table


def check_source() -> None:
    """ValueError naming `SPECEXP_SKINNY_CONFIGS` when it is set to neither `default` nor a directory holding only
    valid tables (each `skinny_*.json` parsed), so a bad setting fails when an engine is configured, not in a
    kernel launch."""
    source = os.environ.get(ENV_VAR, "")
    if source in ("", "default"):
        return
    directory = Path(source)
    if not directory.is_dir():
        raise ValueError(f"{ENV_VAR}={source!r} is not a directory: give one holding skinny_<device>.json tables, "
                         "or 'default' for the output-width rule alone")
    for path in sorted(directory.glob("skinny_*.json")):
        try:
            parse_table(json.loads(path.read_text()), str(path))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None


@functools.cache
def _table(device_name: str, source: str) -> dict:
    if source == "default":
        return {}
    path = _table_file(device_name, source)
    if not path.is_file():
        return {}
    return parse_table(json.loads(path.read_text()), str(path))


def _table_file(device_name: str, source: str) -> Path:
    """The table file GPU model `device_name` reads under `SPECEXP_SKINNY_CONFIGS=source` (unset: the package's)."""
    return table_path(device_name, Path(source) if source else TABLE_DIR)


def _name_and_source(device: torch.device) -> tuple[str, str] | None:
    """(GPU model name, SPECEXP_SKINNY_CONFIGS) for a CUDA device: what picks its table; None for other devices."""
    if device.type != "cuda":
        return None
    return _device_name(triton_support.cuda_index(device)), os.environ.get(ENV_VAR, "")


def tuned_config(device: torch.device, n: int, k: int, element_bytes: int,
                 kernel: str = "skinny") -> tuple[int, int, int, int] | None:
    """`kernel`'s tuned (BLOCK_N, BLOCK_K, num_warps, num_stages) for a weight [n, k] of `element_bytes`-byte
    elements on CUDA device `device`, or None: a CPU device, no table for its GPU model, or no entry for this
    shape."""
    key = _name_and_source(device)
    return None if key is None else _table(*key).get((kernel, n, k, element_bytes))


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def table_in_use(device: torch.device) -> str:
    """What the skinny kernels on `device` take their tiles from, for a run's record: the table's file name, or
    "rule" (no table for this GPU model, `SPECEXP_SKINNY_CONFIGS=default`, or not a CUDA device)."""
    key = _name_and_source(device)
    if key is None or not _table(*key):
        return "rule"
    return _table_file(*key).name
