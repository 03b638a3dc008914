"""Exact GPU kernels (Triton): batch-invariant GEMM, decode-row attention, GDN recurrent step.

On a machine without CUDA, Triton kernels can only run through Triton's CPU interpreter, so it is
selected here, before any kernel is defined (Triton reads TRITON_INTERPRET when it decorates a
kernel). The interpreter's ``tl.dot`` is then replaced by a row-independent one; see _interpreter.
The exactness rule each kernel implements, and its test: docs/exactness.md.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1":
    from specdash.kernels.triton._interpreter import patch_interpreter_dot

    patch_interpreter_dot()
