"""`StepReadBack`: a step's emitted rows copied to the host; on a GPU into alternate page-locked buffers, so a
step queued before the last one was consumed does not overwrite it."""

from __future__ import annotations

import pytest
import torch

from specexp.engine.read_back import StepReadBack


def test_cpu_read_back_is_a_copy_made_on_return():
    read_back = StepReadBack(4, 3, torch.device("cpu"), pin_memory=False)
    out = torch.arange(12, dtype=torch.int64).view(4, 3)
    host, done = read_back.start(out[:2])
    out.zero_()
    assert done is None and host.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_read_backs_alternate_buffers():
    read_back = StepReadBack(4, 3, torch.device("cuda"), pin_memory=True)
    out = torch.arange(12, dtype=torch.int64, device="cuda").view(4, 3)
    first, first_done = read_back.start(out[:3])
    out.add_(100)  # the next step's values, queued before the first read-back is consumed
    second, second_done = read_back.start(out[:1])
    first_done.synchronize()
    second_done.synchronize()
    assert first.is_pinned() and first.data_ptr() != second.data_ptr()
    assert first.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and second.tolist() == [[100, 101, 102]]
