"""On a GPU: the native forward matches the CPU result, and a CUDA graph of it replays any batch that fits
its captured sizes (padding as data, not shape). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from harness import PagedRunner

from specexp.models import AttentionMetadata, ForwardContext, ShortConvMetadata, load_model

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

STEPS = [  # (request, new tokens) per step: prefills, chunk continuations, decodes, joins
    [("a", list(range(10, 19))), ("b", list(range(40, 45)))],
    [("a", [7]), ("b", list(range(50, 56))), ("c", list(range(60, 72)))],
    [("a", [8]), ("b", [9]), ("c", [11])],
    [("c", [12]), ("a", list(range(80, 84)))],
]
NUM_TOKENS, NUM_ROWS, MAX_QUERY_LEN, MAX_BLOCKS, BLOCK_SIZE = 32, 4, 16, 16, 4


@pytest.mark.parametrize("case_id", ["qwen3-qknorm-headdim24", "lfm2-L3-gqa-tied-cacb"])
def test_cuda_forward_matches_cpu(case_cache, case_id):
    case = case_cache(case_id)
    cpu = PagedRunner(load_model(case.path))
    gpu = PagedRunner(load_model(case.path, device="cuda"), device="cuda")
    for batch in STEPS:
        expected, got = cpu.step(batch), gpu.step(batch)
        for rid in expected:
            torch.testing.assert_close(got[rid].cpu(), expected[rid], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case_id", ["llama-gqa-tied-llama3rope", "lfm2-L3-gqa-tied-cacb"])
def test_cuda_graph_replays_every_batch_shape(case_cache, case_id):
    torch.backends.cuda.matmul.allow_tf32 = False
    case = case_cache(case_id)
    model = load_model(case.path, device="cuda")
    runner = PagedRunner(model, max_blocks_per_req=MAX_BLOCKS, block_size=BLOCK_SIZE, device="cuda")
    reference = PagedRunner(load_model(case.path), max_blocks_per_req=MAX_BLOCKS, block_size=BLOCK_SIZE)
    dev = "cuda"
    # Persistent buffers at captured sizes; every step is copied into them.
    ids = torch.zeros(NUM_TOKENS, dtype=torch.int64, device=dev)
    pos = torch.zeros(NUM_TOKENS, dtype=torch.int64, device=dev)
    attn = AttentionMetadata(
        query_start_loc=torch.zeros(NUM_ROWS + 1, dtype=torch.int32, device=dev),
        seq_lens=torch.zeros(NUM_ROWS, dtype=torch.int32, device=dev),
        block_table=torch.zeros(NUM_ROWS, MAX_BLOCKS, dtype=torch.int32, device=dev),
        slot_mapping=torch.full((NUM_TOKENS,), -1, dtype=torch.int64, device=dev),
        token_req_indices=torch.zeros(NUM_TOKENS, dtype=torch.int64, device=dev),
        max_seq_len=MAX_BLOCKS * BLOCK_SIZE, max_query_len=MAX_QUERY_LEN, num_actual_tokens=NUM_TOKENS,
    )
    # All rows go through the non-spec varlen path; the graph only reads tensors, whose sizes are fixed.
    conv = ShortConvMetadata(
        num_prefills=NUM_ROWS, num_prefill_tokens=NUM_TOKENS, num_decodes=0, num_decode_tokens=0, num_spec_decodes=0,
        num_spec_decode_tokens=0, num_actual_tokens=NUM_TOKENS, spec_query_len=1, max_prefill_query_len=MAX_QUERY_LEN,
        query_start_loc=attn.query_start_loc, non_spec_query_start_loc=attn.query_start_loc,
        state_indices_tensor=torch.zeros(NUM_ROWS, dtype=torch.int32, device=dev),
        has_initial_states_p=torch.zeros(NUM_ROWS, dtype=torch.bool, device=dev),
    )
    ctx = ForwardContext(attn, conv, runner.kv_caches, runner.conv_states)

    def load(step_inputs):
        src = step_inputs.ctx
        ids.copy_(step_inputs.input_ids)
        pos.copy_(step_inputs.positions)
        for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping", "token_req_indices"):
            getattr(attn, name).copy_(getattr(src.attn, name))
        conv.state_indices_tensor.copy_(src.conv.state_indices_tensor)
        conv.has_initial_states_p.copy_(src.conv.has_initial_states_non_spec())

    # Capture on an all-padding batch (writes nothing anywhere real).
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                model(ids, pos, ctx)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            hidden = model(ids, pos, ctx)

    for batch in STEPS:
        num_real = sum(len(t) for _, t in batch)
        inputs = runner.prepare(batch, pad_rows=NUM_ROWS - len(batch), pad_tokens=NUM_TOKENS - num_real,
                                max_seq_len=MAX_BLOCKS * BLOCK_SIZE, max_query_len=MAX_QUERY_LEN)
        load(inputs)
        graph.replay()
        logits = model.compute_logits(hidden[:num_real]).cpu()
        for (_, tokens), state in zip(inputs.rows, inputs.states):
            state.num_computed += len(tokens)
        expected = reference.step(batch)
        qsl = inputs.query_start_loc
        for i, (rid, _) in enumerate(inputs.rows):
            torch.testing.assert_close(logits[qsl[i]:qsl[i + 1]], expected[rid], atol=1e-4, rtol=1e-4)
