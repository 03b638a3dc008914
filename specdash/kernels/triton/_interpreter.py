"""A faithful ``tl.dot`` and FP8 conversion for Triton's CPU interpreter.

Why: the interpreter computes ``tl.dot`` with ``np.matmul`` on the raw storage, which (1) treats
bf16 tensors (stored as uint16) as integers and returns garbage, and (2) goes through BLAS, whose
blocking makes a row's result depend on its position in the tile. On the GPU an MMA computes each
row independently, so the CPU tests would check the wrong thing. The replacement upcasts to fp32
and accumulates over K in ascending order, identically for every row. (3) Its float8_e4m3fn
conversion truncates instead of rounding to nearest even as the GPU's does; torch's conversion
rounds as the GPU does (values are clamped to +-448 before, so saturation never differs).
"""

from __future__ import annotations

import numpy as np
import torch


def _from_fp8(data: np.ndarray) -> np.ndarray:
    raw = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8))
    return raw.view(torch.float8_e4m3fn).to(torch.float32).numpy()


def _to_fp8(data: np.ndarray) -> np.ndarray:
    values = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
    return values.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def patch_interpreter_dot() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "__qualname__", "").startswith(patch_interpreter_dot.__name__):
        return  # patched already (once per process)
    original = builder.create_dot
    original_fp_to_fp = builder.create_fp_to_fp

    def as_fp32(handle):
        if handle.dtype.scalar == tl.bfloat16 or handle.dtype.scalar == tl.float16:
            return interpreter._convert_float(
                handle.data, handle.dtype.scalar, tl.float32, None
            ).view(np.float32)
        if handle.dtype.scalar == tl.float8e4nv:
            return _from_fp8(handle.data)
        return handle.data.astype(np.float32)

    def create_dot(self, a, b, d, *args, **kwargs):
        if a.data.ndim != 2 or d.data.dtype != np.float32:
            return original(self, a, b, d, *args, **kwargs)
        a32, b32 = as_fp32(a), as_fp32(b)
        acc = d.data.astype(np.float32, copy=True)
        for kk in range(a32.shape[1]):
            acc += a32[:, kk, None] * b32[None, kk, :]
        return interpreter.TensorHandle(acc, d.dtype.scalar)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar == tl.float32:
            return interpreter.TensorHandle(_to_fp8(src.data), dst_type.scalar)
        if src.dtype.scalar == tl.float8e4nv and dst_type.scalar == tl.float32:
            return interpreter.TensorHandle(_from_fp8(src.data), dst_type.scalar)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.create_dot = create_dot
    builder.create_fp_to_fp = create_fp_to_fp
