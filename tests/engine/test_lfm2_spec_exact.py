"""The native LFM2 driven by `ShortConvMetadataBuilder` verifies drafts exactly: greedy speculative decoding
over mixed batches gives transformers' logits (fp32, 1e-4) on every accepted token, and transformers'
greedy stream.

Each step is what the engine runs: prompt chunks (a one-token last chunk is a plain decode row) next to
verify rows in shuffled order, then pure verify batches padded like a full-graph replay. Drafts are
transformers' greedy continuation up to a chosen point and wrong after it, so acceptance — taken from the
native logits — ranges over every prefix length 1..k+1, and each next verify starts from the rolled-back
conv window and overwritten KV slots.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the model tests' tiny checkpoints
from checkpoints import CASES, build_checkpoint
from harness import paged_step

from specexp.engine.short_conv import ShortConvMetadataBuilder
from specexp.models import (
    ForwardContext,
    allocate_conv_states,
    allocate_kv_caches,
    load_model,
)

TOL = 1e-4
VOCAB = 320
LFM2_CASES = ["lfm2-L3-gqa-tied-cacb", "lfm2-L4-mha-untied-bias-acc"]


@dataclass
class RequestState:
    slot: int
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_accepted: int = 1


class SpecRunner:
    """Paged KV + conv-state caches for one model, and the step metadata the engine would build."""

    def __init__(self, model, k: int, *, max_reqs: int = 6, num_blocks: int = 64, block_size: int = 4):
        self.model, self.k, self.block_size, self.max_blocks = model, k, block_size, 16
        self.kv_caches = allocate_kv_caches(model, num_blocks, block_size, "cpu", torch.float32)
        self.conv_states = allocate_conv_states(model, max_reqs + 1, k, "cpu", torch.float32)
        for state in self.conv_states:  # slots hold a previous owner's leftovers
            state.normal_(generator=torch.Generator().manual_seed(7))
        self.builder = ShortConvMetadataBuilder(num_spec_tokens=k, use_full_cuda_graph=True, max_num_seqs=max_reqs,
                                                max_capture_size=None, device=torch.device("cpu"))
        self.free_blocks = list(range(1, num_blocks))
        self.free_slots = list(range(max_reqs, 0, -1))
        self.requests: dict[str, RequestState] = {}

    def _kv_slots(self, state: RequestState, n: int) -> list[int]:
        while len(state.blocks) * self.block_size < state.num_computed + n:
            state.blocks.append(self.free_blocks.pop(0))
        positions = range(state.num_computed, state.num_computed + n)
        return [state.blocks[p // self.block_size] * self.block_size + p % self.block_size for p in positions]

    @torch.no_grad()
    def step(self, rows: list[tuple[str, list[int], int]], pad_rows: int = 0, pad_tokens: int = 0):
        """rows: (request id, query tokens, drafts: -1 for a prompt chunk). Returns float32[q, V] per row."""
        for rid, _, _ in rows:
            if rid not in self.requests:
                self.requests[rid] = RequestState(self.free_slots.pop())
        states = [self.requests[rid] for rid, _, _ in rows]
        ids, positions, qsl, attn = paged_step([tokens for _, tokens, _ in rows], states, self._kv_slots,
                                               self.max_blocks, pad_rows=pad_rows, pad_tokens=pad_tokens)
        qsl, num_tokens = qsl[: len(rows) + 1], qsl[len(rows)]
        padded = {"num_reqs_padded": len(rows) + pad_rows, "num_tokens_padded": num_tokens + pad_tokens}
        conv = self.builder.build(
            query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
            num_computed_tokens_cpu=torch.tensor([s.num_computed for s in states], dtype=torch.int32),
            num_decode_draft_tokens_cpu=torch.tensor([d for _, _, d in rows], dtype=torch.int32),
            num_accepted_tokens_cpu=torch.tensor([s.num_accepted for s in states], dtype=torch.int32),
            state_indices_cpu=torch.tensor([s.slot for s in states], dtype=torch.int32),
            **(padded if pad_rows or pad_tokens else {}),
        )
        if pad_rows or pad_tokens:
            assert conv.spec_state_indices_tensor.data_ptr() == self.builder._graph.spec_state_indices.data_ptr()
        ctx = ForwardContext(attn=attn, conv=conv, kv_caches=self.kv_caches, conv_states=self.conv_states)
        hidden = self.model(torch.tensor(ids), torch.tensor(positions), ctx)
        logits = self.model.compute_logits(hidden[:num_tokens]).float()
        return [logits[qsl[r]: qsl[r + 1]] for r in range(len(rows))]

    def advance(self, rid: str, num_committed: int, spec: bool) -> None:
        state = self.requests[rid]
        state.num_computed += num_committed
        state.num_accepted = num_committed if spec else 1


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()


def hf_greedy(hf_model, tokens: list[int], n: int) -> list[int]:
    out = list(tokens)
    for _ in range(n):
        out.append(int(hf_logits(hf_model, out)[-1].argmax()))
    return out[len(tokens):]


@pytest.fixture(scope="module", params=LFM2_CASES)
def lfm2(request, tmp_path_factory):
    family, overrides = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf_model = build_checkpoint(path, family, overrides)
    return load_model(path), hf_model


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_verify_with_builder_matches_transformers_on_accepted_tokens(lfm2, k):
    model, hf_model = lfm2
    rng = random.Random(k)
    runner = SpecRunner(model, k)
    prompts = {"a": 9, "b": 13, "c": 5}
    stream = {rid: [rng.randrange(3, VOCAB) for _ in range(n)] for rid, n in prompts.items()}
    checks: list[tuple[str, int, torch.Tensor]] = []  # (request, first position, native logits)
    prompt_done = dict.fromkeys(prompts, 0)
    seen_accepts: set[int] = set()

    def chunk(rid: str, n: int) -> tuple[str, list[int], int]:
        start = prompt_done[rid]
        return rid, stream[rid][start: start + n], -1

    def verify(rid: str, num_right: int, num_drafts: int) -> tuple[str, list[int], int]:
        """[last token] + drafts: transformers' greedy continuation for `num_right`, then wrong tokens."""
        greedy = hf_greedy(hf_model, stream[rid], num_drafts)
        drafts = greedy[:num_right] + [(g + 1 + rng.randrange(VOCAB - 4)) % (VOCAB - 3) + 3
                                       for g in greedy[num_right:]]
        assert all(d != g for d, g in zip(drafts[num_right:], greedy[num_right:]))
        return rid, [stream[rid][-1]] + drafts, num_drafts

    def run(rows, **padding):
        rng.shuffle(rows)
        outs = runner.step(rows, **padding)
        for (rid, tokens, drafts), logits in zip(rows, outs):
            state = runner.requests[rid]
            if drafts < 0:  # prompt chunk: all committed; the last chunk samples the first output token
                checks.append((rid, state.num_computed, logits))
                prompt_done[rid] += len(tokens)
                runner.advance(rid, len(tokens), spec=False)
                if prompt_done[rid] == prompts[rid]:
                    stream[rid].append(int(logits[-1].argmax()))
                continue
            argmax = logits.argmax(-1).tolist()
            accepted = 1
            while accepted <= drafts and tokens[accepted] == argmax[accepted - 1]:
                accepted += 1
            seen_accepts.add(accepted)
            checks.append((rid, state.num_computed, logits[:accepted]))
            # The verified last token and accepted drafts are committed; the token sampled after the last
            # accepted one (correction or bonus) opens the next verify.
            stream[rid] = stream[rid][:-1] + tokens[:accepted] + [argmax[accepted - 1]]
            runner.advance(rid, accepted, spec=True)

    run([chunk("b", 6), chunk("a", 9)])                                       # two prefills
    run([verify("a", 0, k), chunk("b", 7), chunk("c", 4)])                     # all rejected | prefills
    run([verify("a", k, k), verify("b", 1, k - 1), chunk("c", 1)])             # all accepted | 1-token chunk
    run([verify("a", 1, k), verify("b", k, k), verify("c", 0, k)], pad_rows=2, pad_tokens=3)  # graph-padded
    run([verify("c", k, k), verify("a", 0, 1), verify("b", k - 1, k)])
    run([verify("b", 0, 0), verify("c", 1, k), verify("a", k, k)], pad_rows=1, pad_tokens=0)

    assert {1, k + 1} <= seen_accepts
    for rid, prompt_len in prompts.items():
        reference = hf_logits(hf_model, stream[rid][:-1])
        for check_rid, start, logits in checks:
            if check_rid == rid:
                err = (logits - reference[start: start + logits.shape[0]]).abs().max().item()
                assert err <= TOL, f"request {rid} positions {start}+: max-abs logit error {err:.2e} > {TOL}"
        # Greedy speculation is lossless: the emitted stream is transformers' greedy continuation.
        prompt = stream[rid][:prompt_len]
        assert stream[rid] == prompt + hf_greedy(hf_model, prompt, len(stream[rid]) - prompt_len)
