"""SIGINT/SIGTERM inside `interrupts.deferred()` blocks wait for the block's end, or for an `interruptible()`
block inside it, which raises them at once: how Hydra's job loop keeps a signal out of its config handling while
each job's run still stops at once."""

from __future__ import annotations

import os
import signal

import pytest

from specexp import interrupts


@pytest.fixture
def handlers():
    interrupts.install()
    yield
    interrupts.uninstall()


def test_a_signal_in_a_deferred_block_is_raised_where_an_interruptible_block_begins(handlers):
    reached = []
    with pytest.raises(interrupts.RunInterrupted) as raised, interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        reached.append("after the signal")  # held back: the deferred code goes on
        with interrupts.interruptible():
            reached.append("inside")  # never: the held signal is raised on entry
    assert reached == ["after the signal"] and raised.value.signum == signal.SIGINT


def test_an_interruptible_block_takes_a_signal_at_once_and_restores_the_deferral(handlers):
    with interrupts.deferred():
        with pytest.raises(interrupts.RunInterrupted) as raised, interrupts.interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("the signal should have been raised at once")
        assert raised.value.exit_status == 143
        os.kill(os.getpid(), signal.SIGINT)  # a second signal is absorbed: the first is being handled


def test_a_deferred_signal_is_raised_when_the_block_ends(handlers):
    with pytest.raises(interrupts.RunInterrupted), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
    assert interrupts.received() == signal.SIGINT
