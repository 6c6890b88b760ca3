"""Graph dispatch (VLLM-NOTES §8 invariant 10): the smallest captured size that holds a uniform batch, else
eager — checked with the CPU emulation of the graph manager."""

import pytest
import torch

from specexp.engine.cudagraph import (
    FULL,
    NONE,
    BatchExecutionDescriptor,
    CudaGraphManager,
    default_capture_sizes,
    default_seq_len_buckets,
)
from specexp.engine.frozen_heap import frozen_gc


def _manager(sizes=(1, 2, 4, 8), tokens_per_req=3):
    manager = CudaGraphManager("verify", list(sizes), tokens_per_req, torch.device("cpu"))
    manager.capture(lambda desc: None, lambda desc: None)
    return manager


@pytest.mark.parametrize("num_reqs, expected", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_uniform_batch_is_padded_to_the_smallest_captured_size(num_reqs, expected):
    desc = _manager().dispatch(num_reqs, num_reqs * 3, uniform=True)
    assert desc == BatchExecutionDescriptor(expected, expected * 3, FULL)


@pytest.mark.parametrize(
    "num_reqs, num_tokens, uniform",
    [(9, 27, True), (2, 5, True), (2, 6, False)],  # too large; ragged token count; mixed batch
)
def test_other_batches_run_eager_and_are_counted(num_reqs, num_tokens, uniform):
    manager = _manager()
    desc = manager.dispatch(num_reqs, num_tokens, uniform)
    assert desc == BatchExecutionDescriptor(num_reqs, num_tokens, NONE)
    assert (manager.num_eager, manager.num_replays) == (1, 0)


def test_a_disabled_manager_never_replays():
    manager = CudaGraphManager("verify", [1, 2], 1, torch.device("cpu"), enabled=False)
    manager.capture(lambda desc: None, lambda desc: None)
    assert manager.dispatch(1, 1, uniform=True).cg_mode == NONE and not manager.graphs


def test_capture_runs_largest_size_first_and_replay_calls_the_captured_function():
    seen = []
    manager = CudaGraphManager("decode", [1, 4, 2], 1, torch.device("cpu"))
    manager.capture(lambda desc: seen.append(desc.num_reqs), lambda desc: None)
    assert seen == [4, 2, 1]  # one warm-up run per size, largest first (the pool is shared)
    manager.replay(manager.dispatch(3, 3, uniform=True))
    assert seen[-1] == 4


@pytest.mark.parametrize("max_num_reqs, sizes", [(1, [1]), (6, [1, 2, 4, 6]), (16, [1, 2, 4, 8, 16])])
def test_default_capture_sizes_are_powers_of_two_up_to_max(max_num_reqs, sizes):
    assert default_capture_sizes(max_num_reqs) == sizes


@pytest.mark.parametrize("max_seq_len, bucket", [(1, 16), (16, 16), (17, 64), (64, 64), (65, 200), (200, 200)])
def test_a_batch_replays_the_smallest_key_length_bucket_holding_its_longest_row(max_seq_len, bucket):
    manager = CudaGraphManager("verify", [1, 4], 2, torch.device("cpu"), seq_len_buckets=(200, 16, 64))
    manager.capture(lambda desc: None, lambda desc: None)
    desc = manager.dispatch(3, 6, uniform=True, max_seq_len=max_seq_len)
    assert desc == BatchExecutionDescriptor(4, 8, FULL, bucket)
    assert manager.replays_per_graph == {(4, 0, bucket): 1}
    assert manager.summary()["replays_per_graph"] == {f"4x{bucket}@k0": 1}


def test_a_row_longer_than_every_bucket_runs_eager():
    manager = CudaGraphManager("verify", [1], 1, torch.device("cpu"), seq_len_buckets=(16,))
    manager.capture(lambda desc: None, lambda desc: None)
    assert manager.dispatch(1, 1, uniform=True, max_seq_len=17).cg_mode == NONE
    assert (manager.num_eager, manager.num_replays) == (1, 0)


def test_every_size_is_captured_at_every_bucket_largest_first():
    seen = []
    manager = CudaGraphManager("decode", [1, 2], 1, torch.device("cpu"), seq_len_buckets=(32, 8))
    manager.capture(lambda desc: seen.append((desc.num_reqs, desc.max_seq_len)), lambda desc: None)
    assert seen == [(2, 32), (2, 8), (1, 32), (1, 8)]
    assert set(manager.graphs) == {(2, 0, 32), (2, 0, 8), (1, 0, 32), (1, 0, 8)}


@pytest.mark.parametrize("max_seq_len, block_size, buckets", [
    (4096, 16, [256, 512, 1024, 2048, 4096]), (4105, 16, [256, 512, 1024, 2048, 4105]),
    (6000, 16, [256, 512, 1024, 2048, 4096, 6000]), (100, 16, [100]), (300, 16, [300]), (600, 100, [300, 600]),
])
def test_default_seq_len_buckets_double_from_256_in_whole_blocks(max_seq_len, block_size, buckets):
    assert default_seq_len_buckets(max_seq_len, block_size) == buckets


def test_capture_reports_progress_once_per_graph():
    labels = []
    manager = CudaGraphManager("verify", [1, 2], 1, torch.device("cpu"), seq_len_buckets=(8, 16))
    assert manager.num_graphs_to_capture == 4
    manager.capture(lambda desc: None, lambda desc: None, labels.append)
    assert labels == ["verify size 2 keys 16", "verify size 2 keys 8", "verify size 1 keys 16", "verify size 1 keys 8"]
    assert CudaGraphManager("off", [1, 2], 1, torch.device("cpu"), enabled=False).num_graphs_to_capture == 0


def test_eager_steps_carry_their_own_key_length_and_execute_runs_them_eagerly():
    manager = CudaGraphManager("verify", [1], 1, torch.device("cpu"), seq_len_buckets=(16,))
    replayed = []
    manager.capture(lambda desc: replayed.append(desc), lambda desc: None)
    replayed.clear()
    eager = manager.dispatch(2, 2, uniform=True, max_seq_len=40)  # too many rows for any graph
    assert eager == BatchExecutionDescriptor(2, 2, NONE, 40)
    ran = []
    manager.execute(eager, ran.append)
    assert ran == [eager] and not replayed
    manager.execute(manager.dispatch(1, 1, uniform=True, max_seq_len=9), ran.append)
    assert ran == [eager] and replayed == [BatchExecutionDescriptor(1, 1, FULL, 16)]  # the (emulated) replay


def test_frozen_gc_freezes_the_collector_and_always_restores_it():
    import gc

    assert gc.get_freeze_count() == 0
    with frozen_gc():
        assert gc.get_freeze_count() > 0  # live objects are skipped by the captures' gc.collect() calls
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), frozen_gc():
        raise RuntimeError("a capture that fails")
    assert gc.get_freeze_count() == 0


def test_frozen_gc_leaves_what_was_frozen_before_it_frozen():
    import gc

    gc.freeze()  # as a library that freezes the heap for good after its start-up
    try:
        with frozen_gc():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
