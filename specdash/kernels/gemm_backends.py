"""GEMM backends by name (`specdash.registry.gemm`): one table for the native engine and
SGLang's GEMM routing.

A backend is `x[M,K] @ w[N,K].T` (w bf16/fp32, or a block-FP8 `Fp8Weight` where it runs FP8)
that declares what exactness needs to know about it: whether
it is batch-invariant (a row's bits do not depend on M; otherwise exact rows run one by one,
each from an aligned address), the fast path serving non-exact calls (fast verify, draft
steps), and, when it cannot run here, why. An unavailable backend stays listed with its reason,
so the dashboard can show why it cannot be chosen, and choosing it raises EnvironmentProblem.
The engine applies a switch at the next step (a CUDA graph per backend).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from specdash.errors import EnvironmentProblem
from specdash.kernels import cpu_gemm
from specdash.kernels.fp8 import Fp8Weight
from specdash.registry import gemm as registry

Tensor = torch.Tensor
Gemm = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True, slots=True)
class Fp8Gemms:
    """A backend's FP8 GEMMs (the FP8 tile, `kernels.triton.gemm_fp8`; batch-invariant): the
    native engine's linear on block-FP8 weights, and SGLang's two FP8 GEMM signatures for its
    routing (decode and verify of `quantization=fp8` and of block-FP8 checkpoints)."""

    linear: Callable[[Tensor, Fp8Weight], Tensor]
    """(x bf16 [M, K], w) -> x @ w.q rows.T, x quantized per token and 128-column group"""
    scaled_mm: Callable[..., Tensor]
    """sgl_kernel.fp8_scaled_mm(mat_a, mat_b [K, N] col-major, scales_a, scales_b, out_dtype,
    bias=None)"""
    block_matmul: Callable[..., Tensor]
    """w8a8_block_fp8_matmul_triton(A, B [N, K], As, Bs, block_size, output_dtype)"""


@dataclass(frozen=True, slots=True)
class FusedGemms:
    """GEMMs that compute the row op before them inside their operand loads (the Triton tile's
    prologues, `kernels.gemm.Prologue`; the `triton-fused` backend): one launch fewer per fused
    op, 128 per decode step on the 27B shape. Per-row arithmetic in tiles of a fixed shape, so
    still batch-invariant."""

    swiglu: Callable[[Tensor, Tensor], Tensor]
    """(gate_up [M, 2I], w) -> silu(gate) * up @ w.T"""
    sigmoid_gate: Callable[[Tensor, Tensor, Tensor], Tensor]
    """(o [M, H*D], gate [M, H, D], w) -> (o * sigmoid(gate)) @ w.T"""
    gated_norm: Callable[[Tensor, Tensor, Tensor, float, Tensor], Tensor]
    """(o [M, H*D], z [M, H, D], weight [D], eps, w) -> (weight * rmsnorm(o) * silu(z)) @ w.T"""


ROW_ALIGN = 64
"""Bytes every exact one-row GEMM input is aligned to (torch's own allocation alignment)."""


def _aligned(row: Tensor) -> Tensor:
    """`row`, or a copy of it when its address is not ROW_ALIGN-aligned.

    BLAS kernels pick their code path from pointer alignment too: measured with MKL, a
    row of K=33 fp32 starting 1-3 floats off a 16-byte boundary gives different bits
    than the same row at an aligned address. Verify rows are views into a [T, K] tensor,
    at offsets i*K*4, so without this an odd K would break verify == decode.
    """
    return row if row.data_ptr() % ROW_ALIGN == 0 else row.clone()


@dataclass(frozen=True, slots=True)
class GemmBackend:
    name: str
    fn: Gemm | None
    """The exact GEMM; None when the backend is unavailable here."""
    batch_invariant: bool
    fast_fn: Gemm | None = None
    """Serves the non-exact calls, whose bits need not match anything; None: `fn`."""
    unavailable: str | None = None
    """Why the backend cannot run here (one line); None when it can."""
    fused: FusedGemms | None = None
    """Its GEMMs with the row op before them fused in, for exact rows; None: it has none."""
    gate_up_swiglu: Gemm | None = None
    """(x, w = [gate | up]) -> silu(gate) * up in the GEMM's epilogue, for exact rows: the bits
    of `fn` then the SwiGLU row kernel, one launch fewer per MLP; None: it has none."""
    fp8: Fp8Gemms | None = None
    """Its GEMMs of FP8 weights; None: it runs none (a model with FP8 weights refuses it)."""

    def __call__(self, x: Tensor, w: Tensor | Fp8Weight, exact: bool) -> Tensor:
        if isinstance(w, Fp8Weight):
            return self._fp8_linear(x, w, exact)
        fn = self.fn
        assert fn is not None, self.unavailable
        if not exact:
            return (self.fast_fn or fn)(x, w)
        if self.batch_invariant:
            return fn(x, w)
        if x.shape[0] == 1:
            return fn(_aligned(x), w)
        return torch.cat([fn(_aligned(row), w) for row in x.split(1)])

    def _fp8_linear(self, x: Tensor, w: Fp8Weight, exact: bool) -> Tensor:
        """The FP8 rows through the FP8 tile (batch-invariant: exact or not, the same call), the
        unquantized rows after them through this backend's own GEMM."""
        if self.fp8 is None:
            raise EnvironmentProblem(f"GEMM backend {self.name!r} runs no FP8 weights")
        y = self.fp8.linear(x, w)
        return y if w.rest is None else torch.cat([y, self(x, w.rest, exact)], dim=-1)


_TRANSPOSED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _kn(w: Tensor) -> Tensor:
    """A cached contiguous [K, N] copy of w [N, K], remade when w changes in place (its version
    counter); never cached for a weight that needs gradients (GEMM weights twice in memory)."""
    if w.requires_grad:
        return w.t().contiguous()
    cached = _TRANSPOSED.get(w)
    if cached is None or cached[0] != w._version:
        cached = _TRANSPOSED[w] = (w._version, w.t().contiguous())
    return cached[1]


def _cpu_linear(x: Tensor, w: Tensor) -> Tensor:
    """`x @ w.T` through the cached [K, N] copy of w: the CPU's non-exact GEMM.

    MKL's one-row GEMM runs N-wide FMAs down a [K, N] weight; on the [N, K] layout
    `F.linear` hands it, it takes dot products instead, measured 2-2.5x slower over the tiny
    pair's 33 weights.
    """
    if w.requires_grad:
        return F.linear(x, w)
    return torch.matmul(x, _kn(w))


def _cpu_exact(x: Tensor, w: Tensor) -> Tensor:
    """`x @ w.T` with each row's bits independent of the other rows: the CPU's exact GEMM.

    fp32: `cpu_gemm`'s compiled loop (batch-invariant by construction) on the cached [K, N]
    weight, so an exact verify is one call per weight instead of one per row. Other dtypes,
    or where no C compiler works: one `F.linear` per row from an aligned address (decode's
    shape). The choice depends on the dtype and the machine only, never on the row count.
    """
    if x.dtype == torch.float32 and w.dtype == torch.float32 and cpu_gemm.load() is not None:
        return cpu_gemm.gemm_rows(x, _kn(w))
    if x.shape[0] == 1:
        return F.linear(_aligned(x), w)
    return torch.cat([F.linear(_aligned(row), w) for row in x.split(1)])


def build_torch() -> GemmBackend:
    return GemmBackend("torch", _cpu_exact, True, fast_fn=_cpu_linear)


def build_cublas() -> GemmBackend:
    if torch.cuda.is_available():
        return GemmBackend("cublas", F.linear, False)
    reason = "needs a CUDA GPU (torch.cuda.is_available() is False)"
    return GemmBackend("cublas", None, False, unavailable=reason)


def build_triton() -> GemmBackend:
    """The one batch-invariant tile: BLOCK_M pinned, split-K fixed per (N, K)."""
    try:
        from specdash.kernels.triton import gemm
    except Exception as exc:
        return GemmBackend("triton", None, True, unavailable=f"triton kernels do not import: {exc}")
    mm = gemm.matmul_batch_invariant
    swiglu_out = lambda x, w: mm(x, w, swiglu_out=True)  # noqa: E731
    return GemmBackend("triton", mm, True, gate_up_swiglu=swiglu_out)


def build_triton_fused() -> GemmBackend:
    """The same tile with the row op before down_proj, o_proj and out_proj in its loads: a
    backend of its own (its bits are its own), not the default: 0.55x the plain tile's decode
    on an H100 (its GEMMs 33.8 vs 17.9 ms/step, docs/PERF.md)."""
    try:
        from specdash.kernels.triton import gemm
    except Exception as exc:
        reason = f"triton kernels do not import: {exc}"
        return GemmBackend("triton-fused", None, True, unavailable=reason)
    mm = gemm.matmul_batch_invariant
    fused = FusedGemms(
        swiglu=lambda gu, w: mm(gu, w, prologue=gemm.SwiGLU()),
        sigmoid_gate=lambda o, g, w: mm(o, w, prologue=gemm.SigmoidGate(g)),
        gated_norm=lambda o, z, nw, eps, w: mm(o, w, prologue=gemm.GatedRmsNorm(z, nw, eps)),
    )
    return GemmBackend("triton-fused", mm, True, fused=fused)


def build_triton_fp8() -> GemmBackend:
    """`triton` plus the FP8 tile for FP8 weights (on bf16 weights, triton's bits)."""
    try:
        from specdash.kernels.triton import gemm, gemm_fp8
    except Exception as exc:
        reason = f"triton kernels do not import: {exc}"
        return GemmBackend("triton-fp8", None, True, unavailable=reason)
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9):
        reason = "FP8 needs compute capability 8.9 or later (Ada, Hopper)"
        return GemmBackend("triton-fp8", None, True, unavailable=reason)
    mm = gemm.matmul_batch_invariant
    swiglu_out = lambda x, w: mm(x, w, swiglu_out=True)  # noqa: E731
    fp8 = Fp8Gemms(gemm_fp8.linear, gemm_fp8.fp8_scaled_mm, gemm_fp8.w8a8_block_fp8_matmul_triton)
    return GemmBackend("triton-fp8", mm, True, gate_up_swiglu=swiglu_out, fp8=fp8)


def build_deepgemm() -> GemmBackend:
    """DeepGEMM's bf16 NT GEMM if an installed build loads with this torch, else why not."""
    if not torch.cuda.is_available():
        return GemmBackend("deepgemm", None, False, unavailable="needs a CUDA GPU")
    try:
        import deep_gemm
    except Exception as exc:  # an ABI mismatch raises ImportError/OSError with the symbol
        reason = f"deep_gemm does not load: {type(exc).__name__}: {str(exc)[:160]}"
        return GemmBackend("deepgemm", None, False, unavailable=reason)
    gemm = getattr(deep_gemm, "bf16_gemm_nt", None)
    if gemm is None:
        reason = f"deep_gemm {getattr(deep_gemm, '__version__', '?')} has no bf16_gemm_nt"
        return GemmBackend("deepgemm", None, False, unavailable=reason)

    def deepgemm(x: Tensor, w: Tensor) -> Tensor:
        out = torch.empty((x.shape[0], w.shape[0]), device=x.device, dtype=torch.bfloat16)
        gemm(x, w, out)
        return out

    return GemmBackend("deepgemm", deepgemm, False)


CPU_BACKENDS = {e.name: e.load()() for e in registry.on("cpu")}


def exact_kernel(backend: GemmBackend, dtype: torch.dtype) -> str:
    """What `backend`'s exact GEMM runs for `dtype`, for the status line: the CPU's `torch`
    backend hands fp32 to the compiled C loop (`_cpu_exact`), every other pairing runs what
    its name says."""
    if (
        backend is CPU_BACKENDS.get("torch")
        and dtype == torch.float32
        and cpu_gemm.load() is not None
    ):
        return "C loop"
    return backend.name


_gpu_backends: dict[str, GemmBackend] = {}


def gpu_backends() -> dict[str, GemmBackend]:
    """The CUDA backends of `specdash.registry.gemm`, built once and lazily: probing DeepGEMM
    imports CUDA code, and the Triton kernels import Triton."""
    if not _gpu_backends:
        _gpu_backends.update({e.name: e.load()() for e in registry.on("cuda")})
    return _gpu_backends


def backends(device: torch.device) -> dict[str, GemmBackend]:
    """The backends of `device`'s type, usable or not."""
    return CPU_BACKENDS if device.type == "cpu" else gpu_backends()


def resolve(name: str, device: torch.device) -> GemmBackend:
    """The backend `name` ("auto": torch on the CPU, else triton, else the first usable one);
    EnvironmentProblem says why it cannot be had."""
    table = backends(device)
    if name == "auto":
        name = "torch" if device.type == "cpu" else "triton"
        if table[name].unavailable is not None:
            name = next(n for n, b in table.items() if b.unavailable is None)
    found = table.get(name)
    if found is None:
        raise EnvironmentProblem(
            f"GEMM backend {name!r} does not exist on {device.type}; choose from {', '.join(table)}"
        )
    if found.unavailable is not None:
        raise EnvironmentProblem(f"GEMM backend {name!r} is unavailable: {found.unavailable}")
    return found


# ---------------------------------------------------------------- SGLang's GEMM routing


def available_backends() -> dict[str, str | None]:
    """GPU backend name -> None if usable, else the one-line reason it is not: the plain GEMMs
    SGLang's dispatcher routes to (`triton-fused` fuses into the native model's layers; its
    plain GEMM is `triton`'s)."""
    return {name: b.unavailable for name, b in gpu_backends().items() if b.fused is None}


def get_backend(name: str) -> Gemm:
    """The GEMM `(x[M,K], w[N,K]) -> [M,N]` of a GPU backend; EnvironmentProblem says why not."""
    table = gpu_backends()
    if name not in table:
        raise EnvironmentProblem(f"unknown GEMM backend {name!r}; known: {', '.join(table)}")
    fn = table[name].fn
    if fn is None:
        raise EnvironmentProblem(f"GEMM backend {name!r} is unavailable: {table[name].unavailable}")
    return fn


def get_fp8_backend(name: str) -> Fp8Gemms:
    """The FP8 GEMMs of a GPU backend (SGLang's FP8 routing); EnvironmentProblem says why not."""
    get_backend(name)
    fp8 = gpu_backends()[name].fp8
    if fp8 is None:
        raise EnvironmentProblem(f"GEMM backend {name!r} runs no FP8 GEMMs; triton-fp8 does")
    return fp8


def register_backend(name: str, fn: Gemm) -> None:
    """Add a GPU backend that is not batch-invariant (a stand-in GEMM in SGLang's tests)."""
    gpu_backends()[name] = GemmBackend(name, fn, False)
