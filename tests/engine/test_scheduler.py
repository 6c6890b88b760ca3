"""Scheduler bookkeeping under random workloads (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.engine.cache_pool import IdPool, blocks_needed
from specexp.engine.config import EngineConfigError
from specexp.engine.request import Request
from specexp.engine.scheduler import Scheduler


def _make(max_num_seqs, k, budget, num_blocks, block_size=4, max_model_len=64):
    return Scheduler(
        max_num_seqs=max_num_seqs, max_model_len=max_model_len, token_budget=budget, block_size=block_size,
        num_spec_tokens=k, block_pool=IdPool(num_blocks), slot_pool=IdPool(max_num_seqs),
    )


@settings(max_examples=150, deadline=None)
@given(
    prompt_lens=st.lists(st.integers(1, 40), min_size=1, max_size=10),
    max_new=st.integers(1, 12),
    k=st.integers(0, 4),
    max_num_seqs=st.integers(1, 5),
    budget=st.integers(1, 50),
    data=st.data(),
)
def test_every_request_completes_within_budgets(prompt_lens, max_new, k, max_num_seqs, budget, data):
    block_size, max_model_len = 4, 64
    per_req = blocks_needed(max_model_len + 2 * k + 1, block_size)
    num_blocks = per_req * data.draw(st.integers(1, 3))
    sched = _make(max_num_seqs, k, budget, num_blocks, block_size, max_model_len)
    requests = [Request(i, [1] * n, max_new) for i, n in enumerate(prompt_lens)]
    for r in requests:
        sched.add(r)
    for _ in range(2000):
        if not sched.has_work:
            break
        batch = sched.schedule()
        assert batch.rows, "a step with waiting requests must schedule something"
        assert batch.num_reqs <= max_num_seqs
        assert batch.num_tokens <= max(budget, max_num_seqs * (k + 1))
        kinds = [row.is_prefill for row in batch.rows]
        assert kinds == sorted(kinds), "decode/verify rows come before prefill rows"
        for row in batch.rows:
            req = row.request
            # Reserved blocks cover every position the target and the draft may write this step: the target
            # its query, the draft a q+1-slot region from the row's start, then k-1 steps past its new token
            # (at most num_draft_tokens + 1 past the start).
            n, q = req.num_computed_tokens, row.num_query_tokens
            last_pos = n + max(q, row.num_draft_tokens + 1) + k if k else n + q - 1
            assert len(req.block_ids) * block_size > last_pos
            assert 0 <= row.num_draft_tokens <= k
            if not row.is_prefill:  # every draft is scored (uniform rows); acceptance is capped
                assert q == 1 + min(req.num_pending_drafts, k)
                assert req.num_output_tokens + row.num_draft_tokens + 1 <= req.max_new_tokens
                assert len(req.token_ids) + row.num_draft_tokens + 1 <= max_model_len
            if row.is_prefill:
                req.num_computed_tokens += row.num_query_tokens
                if row.samples:
                    assert req.num_computed_tokens == req.num_prompt_tokens
                    req.token_ids.append(7)
                    req.num_pending_drafts = k
            else:
                accepted = data.draw(st.integers(0, row.num_draft_tokens))
                req.num_computed_tokens += accepted + 1
                req.token_ids.extend([7] * (accepted + 1))
            if req.num_output_tokens >= req.max_new_tokens or len(req.token_ids) >= max_model_len:
                req.finished = True
                sched.finish(req)
    assert not sched.has_work
    assert all(r.finished for r in requests)
    assert all(r.num_output_tokens <= max_new for r in requests), "drafts are trimmed to the tokens still allowed"
    assert sched.block_pool.num_free == num_blocks and sched.slot_pool.num_free == max_num_seqs


def test_prompt_that_cannot_fit_in_the_model_length_is_refused():
    sched = _make(2, 0, 16, 100, max_model_len=8)
    with pytest.raises(EngineConfigError, match="max_model_len=8"):
        sched.add(Request(0, [1] * 8, 4))


def test_request_larger_than_the_whole_cache_is_refused():
    sched = _make(2, 0, 16, 2, block_size=4, max_model_len=64)
    with pytest.raises(EngineConfigError, match="KV blocks"):
        sched.add(Request(0, [1] * 20, 4))
