"""One on-disk Triton cache for the engine's kernels and torch.compile's (`triton_support.share_inductor_kernel_cache`):
TRITON_CACHE_DIR pointed at inductor's folder for the device unless the user set it, and left alone off CUDA."""

from __future__ import annotations

import os

import pytest
import torch

from specexp.models import triton_support


def test_it_points_triton_at_inductors_folder(monkeypatch, tmp_path):
    pytest.importorskip("torch._inductor.runtime.cache_dir_utils")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    folder = triton_support.share_inductor_kernel_cache(torch.device("cuda", 1))
    assert folder == str(tmp_path / "triton" / "1")
    assert os.environ["TRITON_CACHE_DIR"] == folder
    # the folder inductor itself picks for device 1 from now on: the same one
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
    assert triton_cache_dir(1) == folder


def test_a_folder_the_user_set_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert triton_support.share_inductor_kernel_cache(torch.device("cuda", 0)) == str(tmp_path / "mine")


def test_nothing_changes_off_cuda(monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    assert triton_support.share_inductor_kernel_cache(torch.device("cpu")) is None
    assert "TRITON_CACHE_DIR" not in os.environ
