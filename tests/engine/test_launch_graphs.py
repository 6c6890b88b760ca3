"""`LaunchGraphs`: a launch captured once per key does, replayed, what launching it again does; the first call's
work is done once (eagerly), not again by the capture; disabled, every call launches."""

from __future__ import annotations

import pytest
import torch

from specexp.engine.launch_graphs import LaunchGraphs


def test_disabled_every_call_launches():
    x = torch.zeros(3)
    launches = LaunchGraphs(enabled=False)
    for key in ("a", "a", "b"):
        launches.run(key, lambda: x.add_(1))
    assert x.tolist() == [3.0, 3.0, 3.0] and launches.num_graphs == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replays_do_the_launch_s_work_once_a_call_per_key():
    x, y = torch.zeros(4, device="cuda"), torch.zeros(2, device="cuda")
    launches = LaunchGraphs(enabled=True)
    calls = [("x", lambda: x.add_(1)), ("y", lambda: y.mul_(2).add_(1))] * 3 + [("x", lambda: x.add_(1))]
    for key, launch in calls:
        launches.run(key, launch)
    torch.cuda.synchronize()
    assert x.tolist() == [4.0] * 4  # four calls: one eager launch, three replays; the capture itself ran nothing
    assert y.tolist() == [7.0] * 2  # ((0 * 2 + 1) * 2 + 1) * 2 + 1
    assert launches.num_graphs == 2
    x.fill_(10)  # a replay reads the buffer as it is now
    launches.run("x", lambda: x.add_(1))
    torch.cuda.synchronize()
    assert x.tolist() == [11.0] * 4
