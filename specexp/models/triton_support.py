"""Triton, where installed: the kernel modules' one import of it, and whether a device can launch their kernels
with programmatic dependent launch.

CUDA builds of torch ship triton; CPU builds do not. The kernel modules stay importable either way: `AVAILABLE`
says whether their kernels can run (on a CUDA device, or on CPU tensors under Triton's interpreter,
`TRITON_INTERPRET=1`), and `triton` / `tl` are None without it.
"""

from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch ship without triton
    triton = tl = None

AVAILABLE = triton is not None
# Whether Triton runs its kernels on CPU tensors in its interpreter (chosen when triton is imported).
INTERPRETER = AVAILABLE and os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on")
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

    @triton.jit
    def arrive_last(counter_ptr, count):
        """Count this program's arrival at counter_ptr (int32 in global memory) once every thread's stores so far
        are done; True in the program that arrives `count`-th, whose acquire makes the others' stores before their
        arrival visible (read them with cache_modifier=".cg"). That program sets the counter back to 0 for the
        next launch (no program of this one arrives after it): a launch's counters start and end at 0."""
        tl.debug_barrier()  # every thread's stores precede the arrival, whose release publishes them
        last = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == count - 1
        if last:
            tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        return last
else:
    wait_for_earlier_kernels = arrive_last = None


def cuda_index(device: torch.device) -> int:
    """The CUDA device index `device` names: its own, or the current device for a bare "cuda"."""
    return device.index if device.index is not None else torch.cuda.current_device()


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
    return _compute_capability_major(cuda_index(device)) >= 9



def share_inductor_kernel_cache(device: torch.device) -> str | None:
    """Make this process's Triton kernels (ours and torch.compile's) share one on-disk cache: unless
    TRITON_CACHE_DIR is set, set it to the folder inductor gives its own Triton kernels for `device`
    (`<inductor cache>/triton/<index>`). Returns the folder (None off CUDA, or where inductor's helper is missing).

    Why: inductor sets TRITON_CACHE_DIR to that folder when it first builds a kernel of its own, which in a
    process that finds its compiled graphs cached comes after some of the engine's kernels have compiled into
    Triton's default (~/.triton/cache). The next process then compiles those again under the other folder: on
    an H100 (2026-12-06) a second identical process recompiled 18 of them, and a fresh machine's second reused
    depth sweep spent 25.6 s building engines against 6.7 s with whole caches."""
    if device.type != "cuda":
        return None
    if os.getenv("TRITON_CACHE_DIR") is None:
        try:
            from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
        except ImportError:  # an older torch: leave Triton's default
            return None
        os.environ["TRITON_CACHE_DIR"] = triton_cache_dir(cuda_index(device))
    return os.environ["TRITON_CACHE_DIR"]
