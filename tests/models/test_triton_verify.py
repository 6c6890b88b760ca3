"""Greedy verification in one Triton kernel (`engine.sampler_kernel=triton`, `specexp.engine.triton_verify`)
against the engine's torch path (`NativeEngine._sample`): the same output rows for random batches (drafts matching
or not, rows that do not sample, fewer drafts than the step's v, the confidence rule, synthetic acceptance with
one rate or one per position), and the same tokens from whole engines; under Triton's CPU interpreter, on a GPU,
and compiled for a Hopper GPU without one."""

from __future__ import annotations

import types

import pytest
import torch
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    hopper_shared_bytes,
    on_triton_gpu,
    run_in_triton_interpreter,
    tiny_hybrid_pair,
)

from specexp.engine import triton_verify
from specexp.engine.config import EngineConfig, EngineConfigError
from specexp.engine.rejection_sampler import RejectionSampler
from specexp.engine.runner import NativeEngine
from specexp.engine.sampling import TritonArgmax, torch_argmax, triton_two_launches

VOCAB = 50


def _batch(gen: torch.Generator, device: str, k: int, v: int, rows: int, max_reqs: int, confidence: bool):
    """(logits fp32[R, v+1, V], row_inputs int64[max_reqs, k+5], speculator-like data): each row's drafts match the
    target's argmax at a random prefix, then at random."""
    draft_tokens = torch.randint(0, VOCAB, (max_reqs, max(k, 1)), generator=gen)
    row_inputs = torch.zeros(max_reqs, k + 5, dtype=torch.int64)
    d_rows = torch.randperm(max_reqs, generator=gen)[:rows]
    row_inputs[:rows, k + 1] = d_rows
    row_inputs[:rows, k + 2] = torch.randint(0, v + 1, (rows,), generator=gen)
    row_inputs[:rows, k + 3] = (torch.rand(rows, generator=gen) < 0.8).long()
    logits = torch.randn(rows, v + 1, VOCAB, generator=gen)
    for r in range(rows):
        prefix = int(torch.randint(0, v + 1, (1,), generator=gen))
        for j in range(v):
            if j < prefix or torch.rand(1, generator=gen) < 0.3:
                logits[r, j, draft_tokens[d_rows[r], j]] = 10.0
    lengths = torch.randint(1, max(k, 1) + 1, (max_reqs,), generator=gen)
    spec = types.SimpleNamespace(draft_tokens=draft_tokens.to(device), draft_lengths=lengths.to(device),
                                 confidence_threshold=0.5 if confidence else 0.0) if k > 0 else None
    return logits.to(device), row_inputs.to(device), spec


def check_rows(device: str) -> None:
    """sample_greedy_rows writes what NativeEngine._sample's torch path writes, row for row, over random batches
    (one synthetic draw per case from equally seeded generators)."""
    gen = torch.Generator().manual_seed(0)
    shared, two = TritonArgmax(device, 64), triton_two_launches(device, 64)
    assert shared.tickets is not None, "the Triton argmax does not run here"
    cases = [(k, v, rows, mode, confidence, rates)
             for k in (0, 1, 3, 5) for v in sorted({0, k // 2, k}) for rows in (1, 4)
             for mode in ("standard", "synthetic") for confidence in ((False, True) if k else (False,))
             for rates in ((None, "per position") if mode == "synthetic" and k else (None,))]
    for k, v, rows, mode, confidence, rates in cases:
        logits, row_inputs, spec = _batch(gen, device, k, v, rows, max_reqs=6, confidence=confidence)
        outs = []
        # the torch path; the kernel after torch's argmax; argmax and kernel in one launch (tickets shared by
        # every case, left at 0); the Triton argmax in two launches, then the kernel (engine.argmax_kernel=
        # triton_two_launches)
        for fused, argmax in ((False, torch_argmax), (True, torch_argmax), (True, shared), (True, two)):
            rejection = RejectionSampler(
                temperature=0.0, top_k=0, top_p=1.0, mode=mode, synthetic_acceptance_rate=0.55,
                synthetic_conditional_rates=[0.9, 0.2, 0.6, 0.7, 0.4][:k] if rates else None,
                generator=torch.Generator(device=device).manual_seed(7), argmax=argmax)
            engine = types.SimpleNamespace(k=k, row_inputs=row_inputs, speculator=spec, req_draft_probs=None,
                                           rejection=rejection, greedy_rows_kernel=fused,
                                           step_out=torch.full((6, k + 3), 99, dtype=torch.int64, device=device))
            NativeEngine._sample(engine, logits, rows)
            outs.append(engine.step_out.cpu())
            assert not shared.tickets.any()
        label = f"k={k} v={v} rows={rows} {mode} confidence={confidence} rates={rates}"
        for name, out in zip(("kernel", "one launch", "two launches"), outs[1:], strict=True):
            assert torch.equal(outs[0], out), f"{label}, {name}:\ntorch {outs[0][:rows]}\nfused {out[:rows]}"
            assert (out[rows:] == 99).all(), f"{label}, {name}: wrote past the step's rows"


def check_engines(device: str) -> None:
    """Engines on the fused kernel emit the torch path's tokens and acceptance: greedy, synthetic, the confidence
    rule, a batch-size schedule (steps at k < K), and k = 0; a hybrid pair and a changing batch."""
    from specexp.engine.config import SamplingConfig, SpeculatorConfig

    target, draft, prompts = tiny_hybrid_pair(device, (5, 9, 3, 7))
    speculators = [SpeculatorConfig(num_speculative_tokens=3),
                   SpeculatorConfig(num_speculative_tokens=3, rejection="synthetic", synthetic_acceptance_rate=0.6),
                   SpeculatorConfig(num_speculative_tokens=4, draft_confidence_threshold=0.2),
                   SpeculatorConfig(num_speculative_tokens=4, num_speculative_tokens_per_batch_size=[[1, 1, 4],
                                                                                                     [2, 3, 2]]),
                   SpeculatorConfig(num_speculative_tokens=0)]
    for speculator in speculators:
        runs = []
        for fused, one_launch in ((False, False), (True, False), (True, True)):
            torch.manual_seed(0)
            engine = NativeEngine(target, draft if speculator.num_speculative_tokens else None,
                                  EngineConfig(device=device, max_num_seqs=3, max_model_len=64), speculator,
                                  SamplingConfig(temperature=0.0, max_new_tokens=12, ignore_eos=True))
            engine.greedy_rows_kernel = fused
            if one_launch:  # the Triton argmax, sharing its launch with the verification
                engine.rejection.argmax = TritonArgmax(device, engine.max_num_tokens)
            out = engine.generate(prompts)
            runs.append(([r.token_ids for r in out.requests], [r.verifies for r in out.requests]))
        assert runs[0] == runs[1] == runs[2], f"{speculator}: {runs}"


def test_rows_match_the_torch_path_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_verify", "check_rows")


def test_engines_match_the_torch_path_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_verify", "check_engines")


@on_triton_gpu
def test_rows_match_the_torch_path_on_gpu():
    check_rows("cuda")


@on_triton_gpu
def test_engines_match_the_torch_path_on_gpu():
    check_engines("cuda")


def test_the_kernel_compiles_for_a_hopper_block():
    if not triton_verify.AVAILABLE:
        pytest.skip("triton is not installed")
    pointers = {"target_ptr": "*i64", "rows_ptr": "*i64", "drafts_ptr": "*i64", "lengths_ptr": "*i64",
                "u_ptr": "*fp32", "rates_ptr": "*fp32", "out_ptr": "*i64"}
    sizes = {"rate": "fp32", "v": "i32", "K": "i32", "stride_target": "i32", "stride_rows": "i32",
             "stride_drafts": "i32", "stride_u": "i32", "stride_out": "i32"}
    for synthetic in (False, True):
        shared = hopper_shared_bytes(
            triton_verify._greedy_verify_kernel, {**pointers, **sizes},
            {"HAS_DRAFTS": True, "CONFIDENCE": True, "SYNTHETIC": synthetic, "RATES": synthetic, "BLOCK": 16}, 1)
        assert shared <= HOPPER_SHARED_BYTES
        one_launch = hopper_shared_bytes(
            triton_verify._argmax_verify_kernel,
            {"logits_ptr": "*fp32", "max_ptr": "*fp32", "index_ptr": "*i32", "nan_ptr": "*i32", "tickets_ptr": "*i32",
             **pointers, "rate": "fp32", "V": "i32", "stride_x": "i32", "num_chunks": "i32", "num_rows": "i32",
             "v": "i32", "K": "i32", "stride_rows": "i32", "stride_drafts": "i32", "stride_u": "i32",
             "stride_out": "i32"},
            {"HAS_DRAFTS": True, "CONFIDENCE": True, "SYNTHETIC": synthetic, "RATES": synthetic, "BLOCK": 16,
             "BLOCK_V": 4096, "CHUNKS": 32}, 8)
        assert one_launch <= HOPPER_SHARED_BYTES


def test_one_launch_rejects_what_it_does_not_take():
    if not triton_verify.AVAILABLE:
        pytest.skip("triton is not installed")
    logits, row_inputs = torch.zeros(2, 3, 10), torch.zeros(2, 8, dtype=torch.int64)
    out = torch.zeros(2, 6, dtype=torch.int64)
    with pytest.raises(ValueError, match="tickets must be int32 on cpu, at least 8"):
        triton_verify.argmax_greedy_verify(logits, torch.zeros(7, dtype=torch.int32), row_inputs, out, 3,
                                           torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="takes logits"):
        triton_verify.argmax_greedy_verify(logits[0], torch.zeros(8, dtype=torch.int32), row_inputs, out, 3, None)


@pytest.mark.parametrize("name", ["argmax_kernel", "sampler_kernel", "draft_step_kernel"])
def test_the_step_kernels_are_validated(name):
    """Each torch | triton switch of the step's small kernels names a bad value, and its Triton choice needs CUDA."""
    with pytest.raises(EngineConfigError, match=f"engine.{name}='fast': valid are 'torch', 'triton'"):
        EngineConfig(**{name: "fast"}).validate()
    with pytest.raises(EngineConfigError, match=f"engine.{name}='triton' needs engine.device=cuda"):
        EngineConfig(device="cpu", **{name: "triton"}).validate()
    EngineConfig(device="cpu", **{name: "torch"}).validate()
