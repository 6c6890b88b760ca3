"""A checkpoint's weight files, found and checked without reading a tensor (standard library only).

:func:`find_weight_files` lists the safetensors files of a model directory (a sharded index's files,
``model.safetensors``, or every ``*.safetensors``). :func:`check_safetensors` reads a file's header only (an
8-byte little-endian length, then that many bytes of JSON) and proves the file whole: not empty, the header
complete and valid JSON, every tensor's byte range inside the file and as long as its dtype and shape
need, the data section exactly covered. A truncated download or a 0-byte file is named before any model is
built, instead of failing deep inside the loader once the other model of the pair has loaded.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

# Bytes per element of each safetensors dtype (F4/F6 packed types are left unchecked).
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


class CheckpointFileError(ValueError):
    """A weight file that cannot be what it claims; the message names the file and what is wrong."""


def find_weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of ``model_dir`` ([] if it has none): a sharded index's files (listed whether or
    not they exist, so a missing shard is reported), else ``model.safetensors``, else every ``*.safetensors``."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointFileError(f"{index}: not a safetensors index (no valid weight_map: {e})") from None
        return [model_dir / f for f in sorted(set(weight_map.values()))]
    if (model_dir / "model.safetensors").is_file():
        return [model_dir / "model.safetensors"]
    return sorted(model_dir.glob("*.safetensors"))


def check_safetensors(path: str | Path) -> int:
    """Check the file at ``path`` (see the module docstring); returns the number of tensors it holds.
    Raises :class:`CheckpointFileError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointFileError(f"{path} is missing (the checkpoint's index lists it)")
    size = os.path.getsize(path)
    if size == 0:
        raise CheckpointFileError(f"{path} is empty (0 bytes): the download or save did not finish")
    if size < 8:
        raise CheckpointFileError(f"{path} is {size} bytes, too short for a safetensors header")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise CheckpointFileError(
                f"{path} is truncated or not a safetensors file: its header claims {header_len} bytes, the file"
                f" has {size - 8} after the length field")
        raw = f.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CheckpointFileError(f"{path} is corrupted: its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointFileError(f"{path} is corrupted: its header is not a JSON object")
    data_bytes = size - 8 - header_len
    end_max = 0
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, info in tensors.items():
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointFileError(f"{path} is corrupted: tensor {name!r} has no valid dtype/shape/data_offsets"
                                      ) from None
        if end > data_bytes:
            raise CheckpointFileError(
                f"{path} is truncated: tensor {name!r} ends at byte {end} of the data, the file holds {data_bytes}")
        if dtype in DTYPE_BYTES and end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise CheckpointFileError(
                f"{path} is corrupted: tensor {name!r} ({dtype} {shape}) needs {math.prod(shape) * DTYPE_BYTES[dtype]}"
                f" bytes, its header gives it {end - begin}")
        end_max = max(end_max, end)
    if end_max != data_bytes:
        raise CheckpointFileError(
            f"{path} is corrupted: its tensors cover {end_max} bytes of a {data_bytes}-byte data section")
    return len(tensors)
