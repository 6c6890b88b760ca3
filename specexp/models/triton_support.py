"""Triton, where installed: the kernel modules' one import of it, and whether a device can launch their kernels
with programmatic dependent launch.

CUDA builds of torch ship triton; CPU builds do not. The kernel modules stay importable either way: `AVAILABLE`
says whether their kernels can run (on a CUDA device, or on CPU tensors under Triton's interpreter,
`TRITON_INTERPRET=1`), and `triton` / `tl` are None without it.
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch ship without triton
    triton = tl = None

AVAILABLE = triton is not None
# Grid dependency control (`tl.extra.cuda.gdc_wait` / `gdc_launch_dependents`, and the `launch_pdl` launch
# option): Triton 3.4 and later.
HAS_GRID_DEPENDENCY_CONTROL = AVAILABLE and hasattr(getattr(tl.extra, "cuda", None), "gdc_wait")

if AVAILABLE:

    @triton.jit
    def wait_for_earlier_kernels(GDC: tl.constexpr):
        """In a kernel launched early (GDC, `early_launch_flags`): let the next kernel launch, then wait until the
        kernels before this one have finished and their writes are visible. Nothing without GDC."""
        if GDC:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
else:
    wait_for_earlier_kernels = None


@functools.cache
def _compute_capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def early_launch_flags(pdl: bool, device: torch.device) -> dict:
    """The `GDC` constexpr and `launch_pdl` launch option of a kernel launched with programmatic dependent launch
    when `pdl` is asked and `device` can (:func:`programmatic_launch`); both off otherwise. A kernel taking GDC
    signals its dependents and waits for the kernels before it first thing."""
    gdc = pdl and programmatic_launch(device)
    return {"GDC": gdc, "launch_pdl": gdc}


def programmatic_launch(device: torch.device) -> bool:
    """Whether a Triton kernel on `device` can be launched with programmatic dependent launch (the kernel may
    start while the one before it on the stream finishes, and waits for it in-kernel): a CUDA device of compute
    capability 9.0 or later (Hopper) and a Triton with grid dependency control. False on CPU tensors (Triton's
    interpreter runs no such instructions)."""
    if not HAS_GRID_DEPENDENCY_CONTROL or device.type != "cuda":
        return False
    return _compute_capability_major(device.index if device.index is not None else torch.cuda.current_device()) >= 9

