"""Programmatic dependent launch of the Triton kernels (`engine.programmatic_launch`: `pdl=True` of the GEMVs, the
uniform attention and the uniform short conv): the same values as the plain launch, bit for bit (the GEMV's
one-chunk-ahead weight loads under Triton's CPU interpreter; the whole launch on a GPU, eagerly, in a CUDA graph of
dependent products and in whole engines); compiled for a Hopper GPU without one, the GEMV loads weights before it
waits, the other kernels load nothing before it, and all signal their dependents; the tables and config checks."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    PRODUCT_SIZES,
    compile_for_hopper,
    on_triton_gpu,
    run_in_triton_interpreter,
    tiny_hybrid_pair,
    variants_to_check,
)

from specexp.engine.config import EngineConfig, EngineConfigError
from specexp.engine.model_kernels import use_engine_kernels
from specexp.models import triton_attention, triton_gemv, triton_short_conv, triton_support
from specexp.models.attention import SDPA, TRITON
from specexp.models.layers import RMSNorm
from specexp.models.linear_ops import CUBLAS, LINEAR_KERNELS, TRITON_SKINNY, linear_kernel_ops
from specexp.models.short_conv_ops import TORCH_CONV, TRITON_CONV

# (K, N): one chunk, exactly one, past one and not a multiple of it (the prefetch of the chunk after the last is
# masked off); N below and past the rows a program takes
SHAPES = [(5, 3), (1024, 37), (2500, 130), (3072, 9)]
POINTERS = ("x_ptr", "norm_w_ptr", "w_ptr", "bias_ptr", "res_ptr", "y_ptr")


def check_same_values(device: str, dtypes=(torch.float32, torch.bfloat16)) -> None:
    """gemv(pdl=True) == gemv(pdl=False) bit for bit: 1, 2 and 5 rows, every norm fusion, bias and residual (in the
    interpreter, large shapes one of those a case, in turn: `variants_to_check`), fp32 logits; gated_gemv too."""
    gen = torch.Generator().manual_seed(0)
    case = 0
    for (k, n), dtype in [(s, d) for s in SHAPES for d in dtypes]:
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
        bias, norm_weight = (torch.randn(n, generator=gen).to(dtype).to(device),
                             (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device))
        for rows in (1, 2, 5):
            x = (torch.randn(rows, k, generator=gen) * 3).to(dtype).to(device)
            residual = torch.randn(rows, n, generator=gen).to(dtype).to(device)
            fusions = [(norm, epilogue) for norm in ({}, {"norm_weight": norm_weight, "eps": 1e-5},
                                                     {"rms_only": True, "eps": 1e-5})
                       for epilogue in ((None, None), (bias, residual))]
            checked = variants_to_check(fusions, device, k * n, case)
            case += len(checked) == 1  # the next large case takes the next fusion
            for norm, (b, r) in checked:
                plain = triton_gemv.gemv(x, w, b, None if r is None else r.clone(), **norm)
                early = triton_gemv.gemv(x, w, b, None if r is None else r.clone(), pdl=True, **norm)
                label = f"K={k} N={n} M={rows} {dtype} {sorted(norm)} bias={b is not None}"
                assert torch.equal(plain, early), label
            if rows == 1:
                logits = triton_gemv.gemv(x, w, bias, out_dtype=torch.float32, pdl=True)
                assert torch.equal(logits, triton_gemv.gemv(x, w, bias).float())
        gate_up = torch.randn(1, 2 * k, generator=gen).to(dtype).to(device)
        assert torch.equal(triton_gemv.gated_gemv(gate_up, w, bias, residual[:1].clone()),
                           triton_gemv.gated_gemv(gate_up, w, bias, residual[:1].clone(), pdl=True)), f"gated K={k}"


def test_same_values_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_pdl", "check_same_values")


@on_triton_gpu
def test_same_values_on_gpu():
    check_same_values("cuda", (torch.float32, torch.bfloat16, torch.float16))


def _chain(x: torch.Tensor, weights: list[torch.Tensor], norm_weight: torch.Tensor, pdl: bool) -> torch.Tensor:
    """Products that each read the one before: a pre-norm product, a gated one added to a residual, a plain one
    whose [1, 2I] output is read as [4, H] rows by the skinny kernel, fp32 logits. No product reads the buffer it
    writes (programs of one launch would race: each reads all of x while others store their rows)."""
    h = triton_gemv.gemv(x, weights[0], norm_weight=norm_weight, eps=1e-5, pdl=pdl)  # [1, 2I]
    residual = x.clone()
    triton_gemv.gated_gemv(h, weights[1], residual=residual, pdl=pdl)  # [1, H]
    rows = triton_gemv.gemv(residual, weights[0], pdl=pdl).view(4, -1)  # [1, 2I] = [4, H]: the skinny kernel's
    mixed = triton_gemv.gemv(rows, weights[2], pdl=pdl)  # [4, H]
    return triton_gemv.gemv(mixed[3:], weights[3], out_dtype=torch.float32, pdl=pdl)


@on_triton_gpu
def test_dependent_products_in_a_cuda_graph():
    """A chain of dependent products launched early, captured in a CUDA graph and replayed on new inputs, equals
    the plain launches: each waits for the product it reads (a missing wait reads a stale buffer)."""
    if not triton_support.programmatic_launch(torch.device("cuda")):
        pytest.skip("needs a GPU of compute capability 9.0+")
    gen = torch.Generator().manual_seed(3)
    hidden, inter, vocab = 2048, 4096, 32000
    weights = [(torch.randn(2 * inter, hidden, generator=gen) / hidden**0.5),
               (torch.randn(hidden, inter, generator=gen) / inter**0.5),
               (torch.randn(hidden, hidden, generator=gen) / hidden**0.5),
               (torch.randn(vocab, hidden, generator=gen) / hidden**0.5)]
    weights = [w.to(torch.bfloat16).cuda() for w in weights]
    norm_weight = (torch.rand(hidden, generator=gen) + 0.5).to(torch.bfloat16).cuda()
    x = torch.zeros(1, hidden, dtype=torch.bfloat16, device="cuda")
    _chain(x, weights, norm_weight, pdl=True)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _chain(x, weights, norm_weight, pdl=True)
    for seed in range(3):
        x.copy_(torch.randn(1, hidden, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16))
        graph.replay()
        assert torch.equal(out, _chain(x, weights, norm_weight, pdl=False)), f"input {seed}"


def check_engines(device: str) -> None:
    """Engines on `engine=cuda`'s kernels with CUDA graphs, launching early or not, emit the same tokens (greedy,
    k = 4, the hybrid pair, a changing batch)."""
    from specexp.engine.config import SamplingConfig, SpeculatorConfig
    from specexp.engine.runner import NativeEngine

    target, draft, prompts = tiny_hybrid_pair(device, (5, 20, 3, 7))
    runs = []
    for pdl in (False, True):
        engine = NativeEngine(
            target, draft,
            EngineConfig(device=device, max_num_seqs=3, max_model_len=64, cudagraph_mode="full",
                         linear_kernel="triton_skinny", fold_norm_weights=True, silu_in_down_gemv=True,
                         attention_kernel="triton", conv_kernel="triton", programmatic_launch=pdl),
            SpeculatorConfig(num_speculative_tokens=4, cudagraph_mode="full"),
            SamplingConfig(temperature=0.0, max_new_tokens=14, ignore_eos=True))
        runs.append([r.token_ids for r in engine.generate(prompts).requests])
    assert runs[0] == runs[1], runs


@on_triton_gpu
def test_engines_emit_the_same_tokens_on_gpu():
    if not triton_support.programmatic_launch(torch.device("cuda")):
        pytest.skip("needs a GPU of compute capability 9.0+")
    check_engines("cuda")


def _gemv_ptx(dtype: str, gdc: bool):
    signature = {**{name: f"*{dtype}" for name in POINTERS}, **PRODUCT_SIZES}
    flags = {"HAS_BIAS": True, "HAS_RESIDUAL": True, "NORM": True, "SCALE": False,
             "BLOCK_N": triton_gemv.NORM_BLOCK_N, "BLOCK_K": triton_gemv.MAX_BLOCK_K, "GATED": False,
             "PREFETCH_W": True, "GDC": gdc}
    return compile_for_hopper(triton_gemv._gemv_kernel, signature, flags, triton_gemv.NUM_WARPS, launch_pdl=gdc)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_gemv_loads_weights_before_it_waits(dtype):
    """Compiled for sm_90: the early-launched GEMV signals its dependents, issues weight loads, then waits once
    (everything it stores comes after the wait); launched with the attribute. The plain launch has neither
    instruction."""
    if not triton_support.HAS_GRID_DEPENDENCY_CONTROL:
        pytest.skip("needs a Triton with grid dependency control")
    compiled = _gemv_ptx(dtype, gdc=True)
    lines = compiled.asm["ptx"].splitlines()
    wait = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    signal = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    assert len(wait) == 1 and len(signal) == 1 and signal[0] < wait[0]
    assert any("ld.global" in line for line in lines[signal[0]:wait[0]]), "no weight load before the wait"
    assert not any("st.global" in line for line in lines[:wait[0]]), "a store before the wait"
    assert compiled.metadata.launch_pdl and compiled.metadata.shared <= HOPPER_SHARED_BYTES
    plain = _gemv_ptx(dtype, gdc=False).asm["ptx"]
    assert "griddepcontrol" not in plain


def test_the_skinny_kernel_waits_first():
    if not triton_support.HAS_GRID_DEPENDENCY_CONTROL:
        pytest.skip("needs a Triton with grid dependency control")
    signature = {**{name: "*bf16" for name in POINTERS}, **PRODUCT_SIZES}
    block_n, block_k, warps, stages = triton_gemv.skinny_config(2048, 2048)
    flags = {"HAS_BIAS": False, "HAS_RESIDUAL": True, "NORM": True, "SCALE": False, "IEEE": False,
             "BLOCK_M": triton_gemv.TOKEN_TILE, "BLOCK_N": block_n, "BLOCK_K": block_k}
    _waits_first(triton_gemv._skinny_kernel, signature, flags, warps, stages)


def test_the_tables_launch_early_only_where_asked():
    assert linear_kernel_ops("cublas", programmatic_launch=True) is CUBLAS
    for name in ("triton_gemv", "triton_skinny"):
        assert linear_kernel_ops(name) is LINEAR_KERNELS[name] and not LINEAR_KERNELS[name].pdl
        early = linear_kernel_ops(name, programmatic_launch=True)
        assert early.pdl and early.with_silu_in_down_gemv().pdl and early.skinny_pdl
        in_order = linear_kernel_ops(name, programmatic_launch=True, skinny_early=False)
        assert in_order.pdl and not in_order.skinny_pdl and not linear_kernel_ops(name, skinny_early=True).skinny_pdl
    assert not linear_kernel_ops("triton_skinny", True, skinny_early=False).with_silu_in_gate_up().skinny_pdl


def test_skinny_products_launch_as_their_own_setting(monkeypatch):
    """A table whose skinny kernel runs in order launches its one-row GEMVs early and its 2..16-row products (the
    projections and the fused gate/up SiLU product) in stream order."""
    from specexp.models import linear_ops

    launches = []
    monkeypatch.setattr(linear_ops.triton_gemv, "supports", lambda *args, **kwargs: True)
    monkeypatch.setattr(linear_ops.triton_gemv, "gemv",
                        lambda x, *args, pdl, **kwargs: launches.append((x.shape[0], pdl)))
    monkeypatch.setattr(linear_ops.triton_gemv, "gate_up_silu",
                        lambda x, *args, pdl, **kwargs: launches.append(("gate_up", pdl)))
    table = linear_kernel_ops("triton_skinny", True, skinny_early=False).with_silu_in_gate_up()
    class OnGpu(torch.Tensor):  # what the table reads of a CUDA tensor (the kernels themselves are stubbed)
        is_cuda = True

    x1, x4, w = (torch.Tensor._make_subclass(OnGpu, torch.zeros(rows, 8)) for rows in (1, 4, 6))
    for x in (x1, x4):
        table.linear(x, w)
        table.norm_linear(x, None, w)
        table.add_linear_(torch.zeros(x.shape[0], 6), x, w)
        table.float_logits(x, w)
    table.gate_up_silu(x4, None, w)
    assert launches == [(1, True)] * 4 + [(4, False)] * 4 + [("gate_up", False)]


def test_the_early_tables_are_torch_off_the_gpu():
    """On CPU tensors the early-launch table falls back to torch's GEMMs, as the plain one does."""
    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(7, 11, generator=gen), torch.randn(7, generator=gen)
    early = linear_kernel_ops("triton_skinny", programmatic_launch=True).with_silu_in_down_gemv()
    norm = RMSNorm(11, 1e-6)
    for rows in (1, 4):
        x, residual = torch.randn(rows, 11, generator=gen), torch.randn(rows, 7, generator=gen)
        assert torch.equal(early.norm_linear(x, norm, w, b), TRITON_SKINNY.norm_linear(x, norm, w, b))
        assert torch.equal(early.add_linear_(residual.clone(), x, w, b),
                           TRITON_SKINNY.add_linear_(residual.clone(), x, w, b))
        assert torch.equal(early.float_logits(x, w, b), TRITON_SKINNY.float_logits(x, w, b))


@pytest.mark.parametrize("name", ["skinny_early_launch", "gemv_early_launch"])
def test_early_launch_roles_are_validated(name):
    with pytest.raises(EngineConfigError, match=f"engine.{name}='verify': valid are 'both', 'target', 'draft', 'none'"):
        EngineConfig(**{name: "verify"}).validate()


def test_programmatic_launch_is_validated():
    with pytest.raises(EngineConfigError, match="engine.programmatic_launch=true .* needs one of "
                                                "engine.linear_kernel=triton_gemv|triton_skinny, attention_kernel"):
        EngineConfig(programmatic_launch=True).validate()
    with pytest.raises(EngineConfigError, match="engine.programmatic_launch='on': must be true, false or auto"):
        EngineConfig(programmatic_launch="on").validate()


def test_auto_launches_early_only_where_it_can():
    """programmatic_launch: auto (engine=cuda's default) is valid with any kernels and launches early only with a
    Triton kernel setting on an sm_90+ GPU; true demands it and names what is missing."""
    plain = EngineConfig(programmatic_launch="auto")
    plain.validate()
    assert not plain.launches_early()  # torch kernels only
    triton_kernels = {"linear_kernel": "triton_skinny", "attention_kernel": "triton", "conv_kernel": "triton"}
    on_cpu = EngineConfig(device="cpu", programmatic_launch="auto", **triton_kernels)  # as a CPU test builds one
    assert not on_cpu.launches_early() and not EngineConfig(programmatic_launch=False, **triton_kernels).launches_early()
    if triton_support.HAS_GRID_DEPENDENCY_CONTROL:
        assert EngineConfig(programmatic_launch=True, **triton_kernels).launches_early()
    with pytest.raises(EngineConfigError, match=r"engine.programmatic_launch=true needs a CUDA GPU \(engine.device=cpu\)"):
        use_engine_kernels((), EngineConfig(device="cpu", programmatic_launch=True))
    if torch.cuda.is_available():
        on_gpu = EngineConfig(device="cuda", programmatic_launch="auto", **triton_kernels)
        assert on_gpu.launches_early() == triton_support.programmatic_launch(torch.device("cuda"))


def test_no_early_launch_on_cpu_tensors():
    assert not triton_support.programmatic_launch(torch.device("cpu"))
    assert triton_support.early_launch_flags(True, torch.device("cpu")) == {"GDC": False, "launch_pdl": False}


def test_uniform_kernels_launched_early():
    """The Triton attention and conv kernels' uniform functions take pdl=True; torch's paths stay as they are."""
    for kernel in (SDPA, TORCH_CONV):
        assert kernel.launched_early() is kernel
    for kernel in (TRITON, TRITON_CONV):
        early = kernel.launched_early()
        assert early.uniform.func is kernel.uniform and early.uniform.keywords == {"pdl": True}
        assert early.varlen is kernel.varlen and early.name == kernel.name


def _waits_first(kernel, signature: dict[str, str], constexprs: dict[str, object], num_warps: int = 4,
                 num_stages: int | None = None) -> None:
    """Compiled for sm_90 with GDC: it signals and waits before any global load (plain or asynchronous), and launches
    with the attribute."""
    compiled = compile_for_hopper(kernel, signature, {**constexprs, "GDC": True}, num_warps, num_stages,
                                  launch_pdl=True)
    lines = compiled.asm["ptx"].splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    signal = next(i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line)
    assert signal < wait, "the dependents are signalled after the wait"
    assert not any("ld.global" in line or "cp.async" in line for line in lines[:wait]), "a load before the wait"
    assert compiled.metadata.launch_pdl and compiled.metadata.shared <= HOPPER_SHARED_BYTES


def test_the_attention_and_conv_kernels_wait_first():
    if not triton_support.HAS_GRID_DEPENDENCY_CONTROL:
        pytest.skip("needs a Triton with grid dependency control")
    pointers = ("q_ptr", "kv_ptr", "block_table_ptr", "seq_lens_ptr", "positions_ptr", "out_ptr", "new_k_ptr",
                "new_v_ptr", "write_index_ptr", "inv_freq_ptr", "q_norm_ptr", "k_norm_ptr", "part_ptr", "ml_ptr",
                "counter_ptr")
    types = {"block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "positions_ptr": "*i64", "write_index_ptr": "*i64",
             "inv_freq_ptr": "*fp32", "part_ptr": "*fp32", "ml_ptr": "*fp32", "counter_ptr": "*i32"}
    ints = ("stride_qt", "stride_qh", "stride_kv", "stride_kb", "stride_ks", "stride_kh", "stride_bt", "stride_ot",
            "stride_nkt", "stride_nkh", "stride_nvt", "stride_nvh")
    signature = {**{p: types.get(p, "*bf16") for p in pointers}, **{i: "i32" for i in ints}, "scale": "fp32",
                 "num_keys": "i32", "eps": "fp32"}
    for split in (False, True):
        _waits_first(triton_attention._paged_attention_kernel, signature,
                     {"Q": 1, "G": 4, "D": 64, "BLOCK_SIZE": 16, "BLOCK_M": 16,
                      "BLOCK_N": triton_attention.KEYS_PER_TILE, "BLOCK_D": 64, "BLOCK_Q": 2, "WRITE_KV": True,
                      "QK_NORM": False, "ROPE": True, "ROUND_HALF": True, "IEEE": False, "SPLIT": split})
    conv_signature = {"bcx_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "state_ptr": "*bf16",
                      "slots_ptr": "*i32", "accepted_ptr": "*i32", "y_ptr": "*bf16", "stride_bcx": "i32",
                      "stride_ws": "i32", "stride_ss": "i32", "stride_sd": "i32", "stride_y": "i32", "dim": "i32",
                      "state_len": "i32"}
    _waits_first(triton_short_conv._gated_short_conv_kernel, conv_signature,
                 {"Q": 5, "W": 3, "HAS_BIAS": False, "NULL_SLOT": 0,
                  "BLOCK_D": triton_short_conv.CHANNELS_PER_PROGRAM, "BLOCK_Q": 8, "BLOCK_C": 8})
