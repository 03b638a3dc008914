"""A faithful ``tl.dot`` for Triton's CPU interpreter.

Why: the interpreter computes ``tl.dot`` with ``np.matmul`` on the raw storage, which (1) treats
bf16 tensors (stored as uint16) as integers and returns garbage, and (2) goes through BLAS, whose
blocking makes a row's result depend on its position in the tile. On the GPU an MMA computes each
row independently, so the CPU tests would check the wrong thing. The replacement upcasts to fp32
and accumulates over K in ascending order, identically for every row.
"""

from __future__ import annotations

import numpy as np


def patch_interpreter_dot() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "__qualname__", "").startswith(patch_interpreter_dot.__name__):
        return  # patched already (once per process)
    original = builder.create_dot

    def as_fp32(handle):
        if handle.dtype.scalar == tl.bfloat16 or handle.dtype.scalar == tl.float16:
            return interpreter._convert_float(
                handle.data, handle.dtype.scalar, tl.float32, None
            ).view(np.float32)
        return handle.data.astype(np.float32)

    def create_dot(self, a, b, d, *args, **kwargs):
        if a.data.ndim != 2 or d.data.dtype != np.float32:
            return original(self, a, b, d, *args, **kwargs)
        a32, b32 = as_fp32(a), as_fp32(b)
        acc = d.data.astype(np.float32, copy=True)
        for kk in range(a32.shape[1]):
            acc += a32[:, kk, None] * b32[None, kk, :]
        return interpreter.TensorHandle(acc, d.dtype.scalar)

    builder.create_dot = create_dot
