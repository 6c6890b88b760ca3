"""Triton, where installed: the kernel modules' one import of it.

CUDA builds of torch ship triton; CPU builds do not. The kernel modules stay importable either way: `AVAILABLE`
says whether their kernels can run (on a CUDA device, or on CPU tensors under Triton's interpreter,
`TRITON_INTERPRET=1`), and `triton` / `tl` are None without it.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch ship without triton
    triton = tl = None

AVAILABLE = triton is not None
