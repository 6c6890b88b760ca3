"""The garbage collector's view of the heap, frozen for a block of work whose time is measured."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def frozen_gc():
    """Collect once, then move every live object out of the garbage collector's view for the block (`gc.freeze`);
    put them back after it.

    A collection walks every tracked object it may free: with models, an engine and earlier results in the process
    a full one takes tens to hundreds of milliseconds. Frozen objects are skipped, so collections inside the block
    see only what the block itself creates: a graph capture's timing measures the capture, a measured pass's the
    pass, whatever else the process holds (vLLM freezes the collector after start-up likewise). Objects the block
    creates are collected as usual. Where objects were frozen before the block (a library that froze them for good),
    they stay frozen after it, with the block's older objects beside them: `gc.unfreeze` cannot tell the two apart.
    """
    frozen_before = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()
