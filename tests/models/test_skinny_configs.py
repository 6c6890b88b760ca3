"""Per-GPU skinny-kernel tiles (specexp.models.skinny_configs): file names, the table's checks, where tables come
from, that `triton_gemv.gemv` launches a table's tile, and that every shipped tile computes F.linear's product
(Triton's interpreter) and fits a Hopper block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    PRODUCT_SIZES,
    hopper_shared_bytes,
    run_in_triton_interpreter,
)

from specexp.models import skinny_configs, triton_gemv

SHIPPED = sorted(skinny_configs.TABLE_DIR.glob("skinny_*.json"))


def test_device_slug_names_a_gpu_model_as_a_file():
    assert skinny_configs.device_slug("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert skinny_configs.device_slug("NVIDIA H200") == "nvidia_h200"
    assert skinny_configs.device_slug("  NVIDIA A100-SXM4-40GB ") == "nvidia_a100_sxm4_40gb"
    path = skinny_configs.table_path("NVIDIA H100 80GB HBM3", Path("/x"))
    assert path == Path("/x/skinny_nvidia_h100_80gb_hbm3.json")


def test_parse_table_keys_entries_by_shape_and_element_size():
    data = {"element_bytes": 2, "configs": [{"n": 3072, "k": 2048, "config": [32, 512, 4, 3]},
                                            {"n": 512, "k": 512, "config": [16, 512, 4, 1]},
                                            {"kernel": "gate_up_silu", "n": 512, "k": 512, "config": [8, 512, 4, 2]}]}
    assert skinny_configs.parse_table(data, "t.json") == {("skinny", 3072, 2048, 2): (32, 512, 4, 3),
                                                          ("skinny", 512, 512, 2): (16, 512, 4, 1),
                                                          ("gate_up_silu", 512, 512, 2): (8, 512, 4, 2)}
    assert skinny_configs.parse_table({"configs": []}, "t.json") == {}


@pytest.mark.parametrize("config", [[32, 512, 4], [24, 512, 4, 3], [8, 512, 4, 2], [32, 512, 3, 2],
                                    [32, 512, 4, 0], [32, 512, 4, "3"]])
def test_parse_table_names_the_file_and_entry_it_rejects(config):
    entry = {"n": 64, "k": 64, "config": config}
    with pytest.raises(ValueError, match=r"bad\.json: skinny config entry .*'config': \["):
        skinny_configs.parse_table({"configs": [entry]}, "bad.json")
    with pytest.raises(ValueError, match="bad.json"):
        skinny_configs.parse_table({"configs": [{"n": "64", "k": 64, "config": [32, 512, 4, 3]}]}, "bad.json")
    for kernel, entry_config in [("gemm", [32, 512, 4, 3]), ("skinny", [8, 512, 4, 2]), ("gate_up_silu", [4, 512, 4, 2])]:
        with pytest.raises(ValueError, match="'kernel': one of \\['gate_up_silu', 'skinny'\\]"):
            skinny_configs.parse_table({"configs": [{"kernel": kernel, "n": 64, "k": 64, "config": entry_config}]}, "b")


def test_tables_come_from_the_package_a_directory_or_nowhere(tmp_path, monkeypatch):
    data = {"device": "Some GPU", "configs": [{"n": 96, "k": 64, "config": [32, 64, 4, 2]}]}
    (tmp_path / "skinny_some_gpu.json").write_text(json.dumps(data))
    assert skinny_configs._table("Some GPU", str(tmp_path)) == {("skinny", 96, 64, 2): (32, 64, 4, 2)}
    assert skinny_configs._table("Other GPU", str(tmp_path)) == {}
    assert skinny_configs._table("NVIDIA H100 80GB HBM3", "default") == {}
    if (skinny_configs.TABLE_DIR / "skinny_nvidia_h100_80gb_hbm3.json").is_file():
        assert skinny_configs._table("NVIDIA H100 80GB HBM3", "")
    # a CPU tensor never takes a GPU's table
    monkeypatch.setenv(skinny_configs.ENV_VAR, str(tmp_path))
    assert skinny_configs.tuned_config(torch.device("cpu"), 96, 64, 2) is None


def test_gemv_launches_the_tuned_tile(monkeypatch):
    """The skinny path asks the table first and runs its tile; an explicit config still wins."""
    pytest.importorskip("triton")
    asked, launched = [], []

    def tuned(device, n, k, element_bytes, kernel="skinny"):
        asked.append((kernel, device.type, n, k, element_bytes))
        return (16, 64, 4, 2) if kernel == "skinny" else (8, 32, 4, 1)

    class Kernel:
        def __getitem__(self, grid):
            def launch(*args, **flags):
                launched.append((grid, flags["BLOCK_N"], flags["BLOCK_K"], flags["num_warps"], flags["num_stages"]))
            return launch

    monkeypatch.setattr(skinny_configs, "tuned_config", tuned)
    monkeypatch.setattr(triton_gemv, "_skinny_kernel", Kernel())
    monkeypatch.setattr(triton_gemv, "_skinny_gate_up_kernel", Kernel())
    x, w = torch.randn(3, 64), torch.randn(96, 64)
    triton_gemv.gemv(x, w)
    triton_gemv.gemv(x, w, config=(32, 32, 4, 1))
    triton_gemv.gate_up_silu(x, w)  # 48 gate rows, 8 a program
    triton_gemv.gate_up_silu(x, w, config=(16, 64, 4, 3))
    assert asked == [("skinny", "cpu", 96, 64, 4), ("gate_up_silu", "cpu", 96, 64, 4)]
    assert launched == [((6,), 16, 64, 4, 2), ((3,), 32, 32, 4, 1), ((6,), 8, 32, 4, 1), ((3,), 16, 64, 4, 3)]


def check_shipped_tiles(device: str) -> None:
    """Each shipped table's tile (BLOCK_K capped at 128 to keep the interpreter quick) gives its fp32 reference at 2
    and 9 rows on a weight of 3 tiles less 5 rows: a skinny tile F.linear's product with a residual and with a
    folded norm, a gate_up_silu tile silu(gate) * up of the normalised x."""
    gen = torch.Generator().manual_seed(0)
    for path in sorted(skinny_configs.TABLE_DIR.glob("skinny_*.json")):
        table = skinny_configs.parse_table(json.loads(path.read_text()), str(path))
        for kernel, (block_n, block_k, warps, stages) in {(key[0], c) for key, c in table.items()}:
            config = (block_n, min(block_k, 128), warps, stages)
            n, k = 3 * block_n - 5, 300
            for rows in (2, 9):
                x = torch.randn(rows, k, generator=gen)
                normed = x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
                if kernel == "gate_up_silu":
                    w = torch.randn(2 * n, k, generator=gen) / k**0.5
                    gate, up = torch.nn.functional.linear(normed, w).chunk(2, dim=-1)
                    got = triton_gemv.gate_up_silu(x.to(device), w.to(device), rms_only=True, eps=1e-5,
                                                   config=config).cpu()
                    expected = torch.nn.functional.silu(gate) * up
                    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), f"{path.name} {kernel} {config}"
                    continue
                w = torch.randn(n, k, generator=gen) / k**0.5
                residual = torch.randn(rows, n, generator=gen)
                expected = torch.nn.functional.linear(x, w) + residual
                got = triton_gemv.gemv(x.to(device), w.to(device), residual=residual.clone().to(device),
                                       config=config).cpu()
                assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), f"{path.name} {config} M={rows}"
                got = triton_gemv.gemv(x.to(device), w.to(device), rms_only=True, eps=1e-5, config=config).cpu()
                assert torch.allclose(got, torch.nn.functional.linear(normed, w), atol=1e-4, rtol=1e-4), path.name


def test_shipped_tiles_compute_f_linear_in_triton_interpreter():
    if not SHIPPED:
        pytest.skip("no table ships")
    run_in_triton_interpreter("test_skinny_configs", "check_shipped_tiles")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_tiles_fit_a_hopper_block(path):
    """Compiled for sm_90 without a GPU, each tile (bf16, residual and norm) asks for no more shared memory than
    a Hopper block has: a table is measured on one card but shipped to every card of its name."""
    if not triton_gemv.AVAILABLE:
        pytest.skip("triton is not installed")
    data = json.loads(path.read_text())
    assert data["device"] and skinny_configs.table_path(data["device"]) == path
    table = skinny_configs.parse_table(data, str(path))
    pointers = {name: "*bf16" for name in ("x_ptr", "norm_w_ptr", "w_ptr", "bias_ptr", "res_ptr", "y_ptr")}
    gate_up_sizes = {"M": "i32", "I": "i32", "K": "i32", "stride_x": "i32", "stride_w": "i32", "stride_y": "i32",
                     "eps": "fp32"}
    for kernel, (block_n, block_k, warps, stages) in {(key[0], c) for key, c in table.items()}:
        tile = {"IEEE": False, "BLOCK_M": triton_gemv.TOKEN_TILE, "BLOCK_N": block_n, "BLOCK_K": block_k}
        if kernel == "gate_up_silu":
            launches = [(triton_gemv._skinny_gate_up_kernel,
                         {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", **gate_up_sizes}, {"NORM": True})]
        else:
            launches = [(triton_gemv._skinny_kernel, {**pointers, **PRODUCT_SIZES},
                         {"HAS_BIAS": False, "HAS_RESIDUAL": not norm, "NORM": norm, "SCALE": False})
                        for norm in (False, True)]
        for fn, signature, flags in launches:
            shared = hopper_shared_bytes(fn, signature, {**flags, **tile}, warps, stages)
            assert shared <= HOPPER_SHARED_BYTES, f"{kernel} {(block_n, block_k, warps, stages)}: {shared} bytes"


def test_a_run_records_where_its_tiles_came_from(tmp_path, monkeypatch):
    assert skinny_configs.table_in_use(torch.device("cpu")) == "rule"
    monkeypatch.setattr(skinny_configs, "_device_name", lambda index: "Some GPU")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    (tmp_path / "skinny_some_gpu.json").write_text(json.dumps(
        {"device": "Some GPU", "configs": [{"n": 96, "k": 64, "config": [32, 64, 4, 2]}]}))
    monkeypatch.setenv(skinny_configs.ENV_VAR, str(tmp_path))
    assert skinny_configs.table_in_use(torch.device("cuda", 0)) == "skinny_some_gpu.json"
    assert skinny_configs.tuned_config(torch.device("cuda"), 96, 64, 2) == (32, 64, 4, 2)
    monkeypatch.setenv(skinny_configs.ENV_VAR, "default")
    assert skinny_configs.table_in_use(torch.device("cuda", 0)) == "rule"
    assert skinny_configs.tuned_config(torch.device("cuda"), 96, 64, 2) is None


def test_a_bad_source_fails_when_the_engine_is_configured(tmp_path, monkeypatch):
    from specexp.engine.config import EngineConfig, EngineConfigError

    monkeypatch.setenv(skinny_configs.ENV_VAR, str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"SPECEXP_SKINNY_CONFIGS='.*absent' is not a directory: .*'default'"):
        skinny_configs.check_source()
    (tmp_path / "skinny_some_gpu.json").write_text('{"configs": [{"n": 1, "k": 1, "config": [1, 1, 1, 1]}]}')
    monkeypatch.setenv(skinny_configs.ENV_VAR, str(tmp_path))
    with pytest.raises(ValueError, match="skinny_some_gpu.json: skinny config entry"):
        skinny_configs.check_source()
    (tmp_path / "skinny_some_gpu.json").write_text("{")
    with pytest.raises(ValueError, match="skinny_some_gpu.json: not JSON"):
        skinny_configs.check_source()
    # the engine's check (its kernel checks, which want CUDA for triton_skinny, passed over on this CPU)
    monkeypatch.setattr(EngineConfig, "_check_kernel", lambda *args: None)
    with pytest.raises(EngineConfigError, match="engine.linear_kernel=triton_skinny: .*skinny_some_gpu.json: not JSON"):
        EngineConfig(device="cpu", linear_kernel="triton_skinny").validate()
    EngineConfig(device="cpu", linear_kernel="cublas").validate()  # not the skinny kernel: no check
    for source in ("default", ""):
        monkeypatch.setenv(skinny_configs.ENV_VAR, source)
        skinny_configs.check_source()
