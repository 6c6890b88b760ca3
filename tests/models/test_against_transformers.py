"""Native logits equal transformers' (fp32 CPU, 1e-4 max-abs) for every case and step pattern the engine
produces: whole prefill, mixed decode/prefill batches, chunked prefill, decode steps, padding."""

from __future__ import annotations

import pytest
import torch
from harness import PagedRunner

from specexp.models import load_model

TOL = 1e-4


def reference_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    """transformers' logits of one whole sequence, no cache: float32[len(tokens), vocab]."""
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()


def random_tokens(seed: int, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_close(native: torch.Tensor, reference: torch.Tensor) -> None:
    err = (native - reference).abs().max().item()
    assert err <= TOL, f"max-abs logit error {err:.2e} > {TOL}"


class Replay:
    """Feeds each request's fixed token sequence through a PagedRunner in chunks and checks every chunk's
    logits against transformers' logits of the whole sequence at the same positions."""

    def __init__(self, case, sequences: dict, **runner_kwargs):
        self.model = load_model(case.path)
        self.runner = PagedRunner(self.model, **runner_kwargs)
        self.sequences = sequences
        self.reference = {rid: reference_logits(case.hf_model, seq) for rid, seq in sequences.items()}
        self.done = dict.fromkeys(sequences, 0)

    def step(self, chunks: dict, **step_kwargs) -> dict:
        batch = []
        for rid, n in chunks.items():
            batch.append((rid, self.sequences[rid][self.done[rid]:self.done[rid] + n]))
        out = self.runner.step(batch, **step_kwargs)
        for rid, n in chunks.items():
            assert_close(out[rid], self.reference[rid][self.done[rid]:self.done[rid] + n])
            self.done[rid] += n
        return out


def test_whole_prefill_matches_transformers(case):
    replay = Replay(case, {"a": random_tokens(0, 13, 320)})
    replay.step({"a": 13})


def test_mixed_batch_of_different_lengths_matches_transformers(case):
    seqs = {"a": random_tokens(1, 12, 320), "b": random_tokens(2, 17, 320), "c": random_tokens(3, 11, 320)}
    replay = Replay(case, seqs)
    replay.step({"a": 7, "b": 11})
    replay.step({"a": 1, "b": 5, "c": 9})  # decode + chunk continuation + fresh prefill
    replay.step({"a": 1, "b": 1, "c": 1})
    replay.step({"c": 1, "a": 3})


def test_chunked_prefill_matches_transformers(case):
    replay = Replay(case, {"a": random_tokens(4, 27, 320)})
    for n in (5, 1, 8, 2, 11):  # a 1-token chunk runs as a decode row with initial state
        replay.step({"a": n})


def test_twenty_decode_steps_match_transformers(case):
    seqs = {"a": random_tokens(5, 26, 320), "b": random_tokens(6, 29, 320)}
    replay = Replay(case, seqs)
    replay.step({"a": 6, "b": 9})
    for _ in range(20):
        replay.step({"a": 1, "b": 1})


def test_graph_padding_changes_nothing_and_stays_finite(case):
    seqs = {"a": random_tokens(7, 14, 320), "b": random_tokens(8, 10, 320)}
    replay = Replay(case, seqs)
    padding = dict(pad_rows=3, pad_tokens=5, max_seq_len=64, max_query_len=16)
    replay.step({"a": 9, "b": 4}, **padding)
    assert torch.isfinite(replay.runner.last_hidden).all()
    for _ in range(3):
        replay.step({"a": 1, "b": 1}, **padding)
        assert torch.isfinite(replay.runner.last_hidden).all()
    replay.step({"a": 2, "b": 3}, **padding)


def test_request_logits_do_not_depend_on_batch_companions(case):
    seqs = {name: random_tokens(10 + i, 24, 320) for i, name in enumerate("xyzw")}
    model = load_model(case.path)
    alone = PagedRunner(model)
    crowd = PagedRunner(model)
    schedule = [  # x's chunk, companions (id, n) joining / continuing / leaving
        (6, [("y", 8), ("z", 3)]),
        (1, [("y", 1), ("z", 5), ("w", 11)]),
        (1, []),
        (4, [("w", 1), ("y", 1)]),
        (1, [("z", 1)]),
    ]
    done = dict.fromkeys(seqs, 0)
    for x_n, companions in schedule:
        x_chunk = seqs["x"][done["x"]:done["x"] + x_n]
        batch = [("x", x_chunk)]
        for rid, n in companions:
            batch.append((rid, seqs[rid][done[rid]:done[rid] + n]))
            done[rid] += n
        done["x"] += x_n
        solo = alone.step([("x", x_chunk)])["x"]
        together = crowd.step(batch[::-1])["x"]
        err = (solo - together).abs().max().item()
        assert err <= 1e-5, f"x's logits moved by {err:.2e} when others shared its batch"
        if done["z"] >= 9 and "z" in crowd.requests:
            crowd.finish("z")  # z leaves; its slot and blocks are reused by nobody here, stale data stays


def test_reused_blocks_and_conv_slots_start_clean(case):
    """A request given a freed slot/blocks (stale contents) matches transformers from its first token."""
    replay = Replay(case, {"old": random_tokens(20, 15, 320), "new": random_tokens(21, 11, 320)})
    replay.step({"old": 15})
    replay.runner.finish("old")
    replay.step({"new": 6})
    replay.step({"new": 1})
    replay.step({"new": 4})


@pytest.mark.parametrize("case_id", ["llama-gqa-tied-llama3rope", "lfm2-L3-gqa-tied-cacb"])
def test_long_context_across_many_blocks(case_cache, case_id):
    case = case_cache(case_id)
    replay = Replay(case, {"a": random_tokens(30, 90, 320)}, num_blocks=64, block_size=4, max_blocks_per_req=32)
    replay.step({"a": 70})
    for _ in range(5):
        replay.step({"a": 1})
    replay.step({"a": 15})
