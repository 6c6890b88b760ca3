"""Where the Triton kernel checks run: on a GPU (`on_triton_gpu`), under Triton's CPU interpreter in a
subprocess (`run_in_triton_interpreter`: the interpreter is chosen when triton is imported, so it cannot be
switched on inside the test process), or through Triton's compiler for a Hopper GPU without one
(`hopper_shared_bytes`). All skip where triton is not installed (torch's CPU builds ship without it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specexp.models import triton_support

MODELS_TESTS = Path(__file__).resolve().parent
ROOT = MODELS_TESTS.parents[1]


def on_triton_gpu(test):
    """Mark `test` as a GPU test (`pytest -m cuda`) that runs only where CUDA and triton are."""
    needs = pytest.mark.skipif(not torch.cuda.is_available() or not triton_support.AVAILABLE,
                               reason="needs a CUDA GPU")
    return pytest.mark.cuda(needs(test))


# Elements of a weight (K * N, or 2I * K) from which Triton's interpreter is slow enough that a check takes one of
# its variants (bias / residual, norm fusion) a case, in turn, instead of all of them
BIG_SHAPE = 100_000


def variants_to_check(variants: list, device: str, num_elements: int, turn: int) -> list:
    """All of `variants` on a GPU and for small weights; under the interpreter (CPU tensors) for a weight of
    `num_elements` >= BIG_SHAPE, the one at `turn` (mod their count), so that consecutive cases meet each in turn."""
    if device != "cpu" or num_elements < BIG_SHAPE:
        return variants
    return [variants[turn % len(variants)]]


def run_in_triton_interpreter(module: str, check: str, *args: str) -> None:
    """`from {module} import {check}; {check}("cpu", *args)` with TRITON_INTERPRET=1; args are Python
    expressions (torch is imported). Fails with the subprocess's stderr when the check fails."""
    if not triton_support.AVAILABLE:
        pytest.skip("triton is not installed")
    code = (f"import sys, torch; sys.path.insert(0, {str(MODELS_TESTS)!r}); from {module} import {check}; "
            f"{check}('cpu', {', '.join(args)}); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def tiny_hybrid_pair(device: str, prompt_lengths: tuple[int, ...], draft: str = "tiny-random-lfm2-draft") -> tuple:
    """(target, draft, prompts): the zoo's random tiny LFM2 target and hybrid LFM2 draft (or the zoo config `draft`;
    fp32, on `device`) and one random prompt of each length, for checks that run whole engines (in the interpreter:
    CPU tensors)."""
    from specexp.models import load_model
    from specexp.models.loader import ZOO_DIR

    configs = ZOO_DIR / "configs"
    target = load_model(configs / "tiny-random-lfm2", dtype=torch.float32, device=device, weights="random", seed=0)
    draft = load_model(configs / draft, dtype=torch.float32, device=device, weights="random", seed=1)
    gen = torch.Generator().manual_seed(0)
    return target, draft, [torch.randint(3, 500, (n,), generator=gen).tolist() for n in prompt_lengths]


# Shared memory one block may use on a Hopper GPU (H100 / H200: 227 KiB), as Triton's launch checks it.
HOPPER_SHARED_BYTES = 232448
# The scalar arguments of triton_gemv's GEMV and skinny kernels, after their six pointers, as a signature for
# compiling them without a GPU (`hopper_shared_bytes`, `compile_for_hopper`).
PRODUCT_SIZES = {"M": "i32", "N": "i32", "K": "i32", "stride_x": "i32", "stride_w": "i32", "stride_y": "i32",
                 "eps": "fp32"}


def compile_for_hopper(kernel, signature: dict[str, str], constexprs: dict[str, object], num_warps: int,
                       num_stages: int | None = None, **options):
    """Compile `kernel` for sm_90 (PTX and cubin, with Triton's bundled ptxas; no GPU needed) and return Triton's
    compiled kernel (`.asm["ptx"]`, `.metadata`). signature: argument name -> Triton type ("*bf16", "i32",
    "fp32"); constexprs: name -> value; options: further compile options (e.g. launch_pdl). Skips where triton is
    not installed."""
    if not triton_support.AVAILABLE:
        pytest.skip("triton is not installed")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # In the kernel's parameter order; a constexpr left out takes its default (wherever it stands).
    values = dict(constexprs)
    for param in kernel.params:
        if param.name not in signature and param.name not in values and param.is_constexpr and param.has_default:
            values[param.name] = param.default
    missing = [param.name for param in kernel.params if param.name not in signature and param.name not in values]
    if missing:
        raise ValueError(f"compile_for_hopper: no type or value for {missing}")
    full = {param.name: signature.get(param.name, "constexpr") for param in kernel.params}
    source = ASTSource(fn=kernel, signature=full,
                       constexprs={(param.num,): values[param.name] for param in kernel.params
                                   if param.name in values})
    options = {"num_warps": num_warps, **options} | ({"num_stages": num_stages} if num_stages else {})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def hopper_shared_bytes(kernel, signature: dict[str, str], constexprs: dict[str, object], num_warps: int,
                        num_stages: int | None = None) -> int:
    """The shared memory (bytes) the launch of `kernel` compiled for sm_90 asks for (:func:`compile_for_hopper`)."""
    return compile_for_hopper(kernel, signature, constexprs, num_warps, num_stages).metadata.shared


def engines_emit_the_same_tokens(device: str, speculator_kernels: dict, num_speculative_tokens: int,
                                 max_new_tokens: int, draft: str = "tiny-random-lfm2-draft") -> None:
    """Two engines on `tiny_hybrid_pair` (max 3 rows, prompts of 5, 20, 3 and 7 tokens: a changing batch), the
    second's speculator running `speculator_kernels` ({attribute: kernel}, set after it is built), emit the same
    tokens, greedy and at T = 1. draft: the zoo config of the draft (the hybrid LFM2 draft, or an attention-only
    one, e.g. tiny-random-llama-draft of the same vocabulary)."""
    from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
    from specexp.engine.runner import NativeEngine

    target, draft, prompts = tiny_hybrid_pair(device, (5, 20, 3, 7), draft)
    for temperature in (0.0, 1.0):
        runs = []
        for changed in (False, True):
            torch.manual_seed(0)
            engine = NativeEngine(target, draft, EngineConfig(device=device, max_num_seqs=3, max_model_len=64),
                                  SpeculatorConfig(num_speculative_tokens=num_speculative_tokens),
                                  SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens,
                                                 ignore_eos=True))
            if changed:
                for name, kernel in speculator_kernels.items():
                    setattr(engine.speculator, name, kernel)
            runs.append([r.token_ids for r in engine.generate(prompts).requests])
        assert runs[0] == runs[1], f"T={temperature}: {runs}"
