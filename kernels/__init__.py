"""Exact GPU kernels (Triton): batch-invariant GEMM, decode-row attention, GDN recurrent step.

On a machine without CUDA, Triton kernels can only run through Triton's CPU interpreter, so it is
selected here, before any kernel is defined (Triton reads TRITON_INTERPRET when it decorates a
kernel). The interpreter's ``tl.dot`` is then replaced by a row-independent one; see _interpreter.
The exactness rule each kernel implements, and its test: docs/exactness.md.
"""

import os
import sys

if __name__ == "kernels":
    # Imported as top-level `kernels`: a checkout's root is on sys.path (`python -m` run from
    # it), and what was asked for is the PyPI `kernels` that transformers imports. This folder
    # is `specdash.kernels`; hand the name over to the real package. Without one, leave what a
    # stray folder would be, an empty namespace package: transformers (5.24 on) imports the name
    # to probe for it, takes "no __file__, no __version__" as not installed, and does not catch
    # an ImportError there.
    from importlib.machinery import ModuleSpec, PathFinder
    from importlib.util import module_from_spec
    from types import ModuleType

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    _spec = PathFinder.find_spec("kernels", _path)
    if _spec is None or _spec.loader is None:
        sys.modules["kernels"] = _empty = ModuleType("kernels")
        _empty.__path__ = []
        _empty.__spec__ = ModuleSpec("kernels", None, is_package=True)
    else:
        sys.modules["kernels"] = _real = module_from_spec(_spec)
        _spec.loader.exec_module(_real)
else:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")

    if os.environ.get("TRITON_INTERPRET") == "1":
        from specdash.kernels._interpreter import patch_interpreter_dot

        patch_interpreter_dot()
