"""GEMM backends by name, so the engine can switch between steps (``triton``, ``cublas``, ...).

Why a registry: the dashboard compares backends live, and the CPU engine registers its own
(``rowwise``, ``torch``) into the same table. An unavailable backend stays listed with the reason,
so the UI can show why it cannot be chosen, and asking for it raises EnvironmentProblem.
The engine applies a switch at the next step (a CUDA graph per backend, or a recapture).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specdash.errors import EnvironmentProblem

GemmFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_backends: dict[str, tuple[GemmFn | None, str | None]] = {}
_builtins_registered = False


def register_backend(name: str, fn: GemmFn | None, unavailable_reason: str | None = None) -> None:
    """Add or replace a backend; ``fn`` may be None only together with a reason."""
    if fn is None and unavailable_reason is None:
        raise ValueError(f"backend {name!r}: give a function or the reason it is unavailable")
    _backends[name] = (fn, unavailable_reason)


def available_backends() -> dict[str, str | None]:
    """Backend name -> None if usable, else the one-line reason it is not."""
    _register_builtins()
    return {name: reason for name, (_, reason) in _backends.items()}


def get_backend(name: str) -> GemmFn:
    """The GEMM ``(x[M,K], w[N,K]) -> [M,N]`` of that backend; EnvironmentProblem says why not."""
    _register_builtins()
    if name not in _backends:
        raise EnvironmentProblem(
            f"unknown GEMM backend {name!r}; known: {', '.join(sorted(_backends))}"
        )
    fn, reason = _backends[name]
    if reason is not None or fn is None:
        raise EnvironmentProblem(f"GEMM backend {name!r} is unavailable: {reason}")
    return fn


def _cublas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


def _deepgemm_or_reason() -> tuple[GemmFn | None, str | None]:
    """DeepGEMM's bf16 NT GEMM if an installed build loads with this torch, else why not."""
    if not torch.cuda.is_available():
        return None, "needs a CUDA GPU"
    try:
        import deep_gemm
    except Exception as exc:  # an ABI mismatch raises ImportError/OSError with the symbol
        return None, f"deep_gemm does not load: {type(exc).__name__}: {str(exc)[:160]}"
    gemm = getattr(deep_gemm, "bf16_gemm_nt", None)
    if gemm is None:
        return None, f"deep_gemm {getattr(deep_gemm, '__version__', '?')} has no bf16_gemm_nt"

    def deepgemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty((x.shape[0], w.shape[0]), device=x.device, dtype=torch.bfloat16)
        gemm(x, w, out)
        return out

    return deepgemm, None


def _register_builtins() -> None:
    """Registers triton, cublas and deepgemm once, lazily: probing DeepGEMM imports CUDA code."""
    global _builtins_registered
    if _builtins_registered:
        return
    _builtins_registered = True
    try:
        from specdash.kernels.gemm import matmul_batch_invariant
    except Exception as exc:
        builtins = {"triton": (None, f"triton kernels do not import: {exc}")}
    else:
        builtins = {"triton": (matmul_batch_invariant, None)}
    if torch.cuda.is_available():
        builtins["cublas"] = (_cublas, None)
    else:
        builtins["cublas"] = (None, "needs a CUDA GPU (torch.cuda.is_available() is False)")
    builtins["deepgemm"] = _deepgemm_or_reason()
    for name, (fn, reason) in builtins.items():
        _backends.setdefault(name, (fn, reason))
