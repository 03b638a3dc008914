"""GEMM routing: every bf16 GEMM, lm_head included, through one live-switchable dispatcher.

Why: the dashboard compares GEMM kernels live on the same run. In SGLang's deterministic mode
(on by default in specdash) `aten::mm/addmm/mm.out` are registered to call the module global
`batch_invariant_ops.matmul_persistent`, so `F.linear` in `UnquantizedLinearMethod.apply` and
`torch.matmul` in `LogitsProcessor._compute_lm_head` both end up there. Rebinding that one
global (never registering a second `aten::mm`) routes them all.

Backends: `auto` (the default: prefill batches on SGLang's own choice, every other forward
(decode, verify, draft) on specdash's Triton tile, below), `deepgemm` (SGLang's
`_matmul_persistent_deepgemm`),
`sglang-triton` (SGLang's `matmul_kernel_persistent`), and `specdash-<name>` for each backend
in `specdash.kernels.gemm_backends` (imported lazily; without it only the SGLang ones exist).
The switch reaches every scheduler rank through `Engine.collective_rpc("specdash_set_gemm_backend",
name=...)`, a method this patch adds to `Scheduler`; it recaptures the target's decode CUDA
graphs (which froze the old kernel) or refuses when it cannot.

Why `auto` splits by forward: SGLang's persistent matmul has one tile shape (BLOCK_M 128) for
every M, which at decode's M = 1..k+1 streams each weight at a fraction of HBM bandwidth
(docs/PERF.md: 17.8 tok/s at the 27B shape on an H100, against 52.4 for specdash's own engine
with the BLOCK_M 16 tile), and prefill is where its large tile pays. The split is by forward
mode, never by M: a row must go through the same kernel in the speculative and the shadow
engine, and with several requests the same prompt's prefill (or a verify) comes in batches of
any M. Every non-prefill forward of both engines runs the tile, every prefill SGLang's kernel,
so a verify row and the decode row it must equal always share a kernel. The forward mode reaches
the GEMM through `prefill_forward`, set around each `model.forward` (CUDA graph captures
included: they call the same `model.forward`) by the wrapper `load_model` installs.

Exactness: SGLang's persistent matmul and specdash's Triton tile are batch-invariant (a row's
bits do not depend on M). cuBLAS and DeepGEMM are not, so they run row by row for M up to
ROWWISE_MAX_ROWS (every decode and verify GEMM): a verify row then gets the bits of the decode
row; prefill (larger M) runs batched, the same way in the speculative and the shadow engine.

Per SGLang release: 0.5.23's `matmul_persistent` takes `out_dtype`, 0.5.17's does not; 0.5.17
recaptures with `ModelRunner.init_decode_cuda_graph` (0.5.23: `recapture_decode_cuda_graph`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from specdash.runs.sglang.patches.registry import Patch, Rebinding, Target, Variant

logger = logging.getLogger(__name__)

_OPS = "sglang.srt.batch_invariant_ops.batch_invariant_ops"
SGLANG_BACKENDS = ("auto", "deepgemm", "sglang-triton")
SPECDASH_PREFIX = "specdash-"

ROWWISE_MAX_ROWS = 64
"""Largest M run row by row on a backend that is not batch-invariant."""
BATCH_INVARIANT = ("auto", "sglang-triton", "specdash-triton")

_active = "auto"
DECODE_BACKEND = f"{SPECDASH_PREFIX}triton"
"""What `auto` runs every non-prefill forward's GEMMs on: the tile with BLOCK_M 16."""
prefill_forward = False
"""Whether the forward running in this process is a prefill batch (`auto` keeps its GEMMs on
SGLang's kernel); set by `mark_prefill_forwards`."""


def specdash_backends() -> dict[str, str | None]:
    """specdash.kernels GEMM backends as `specdash-<name>` -> None or why unavailable."""
    try:
        from specdash.kernels import gemm_backends
    except ImportError as e:
        return {f"{SPECDASH_PREFIX}*": f"specdash.kernels.gemm_backends does not import: {e}"}
    return {f"{SPECDASH_PREFIX}{n}": r for n, r in gemm_backends.available_backends().items()}


def backends() -> dict[str, str | None]:
    """Every backend name the dispatcher knows -> None if usable, else why not (SGLang's own
    taken as usable: only a scheduler knows)."""
    return {**dict.fromkeys(SGLANG_BACKENDS), **specdash_backends()}


def routes() -> dict[str, str | None]:
    """`backends`, DeepGEMM asked of the installed SGLang: what a session's header offers."""
    return backends() | {"deepgemm": deepgemm_unavailable()}


def deepgemm_unavailable() -> str | None:
    """Why SGLang's DeepGEMM cannot run here; None when it can."""
    try:
        enabled = getattr(sglang_batch_invariant_ops(), "ENABLE_JIT_DEEPGEMM", False)
    except Exception as e:  # no SGLang here, or one whose GEMM module does not import
        return f"SGLang's batch_invariant_ops does not import: {type(e).__name__}: {e}"[:200]
    if not enabled:
        return (
            "SGLang's ENABLE_JIT_DEEPGEMM is off here "
            "(deep_gemm not installed or not supported on this GPU)"
        )
    return None


def set_backend(name: str) -> None:
    """Select the backend for the next GEMM in this process.

    A bare specdash.kernels name (`triton`) means `specdash-triton`; an unknown or unavailable
    backend raises (specdash.errors.EnvironmentProblem, with the reason).
    """
    global _active
    if name == "deepgemm" and (why := deepgemm_unavailable()) is not None:
        from specdash.errors import EnvironmentProblem

        raise EnvironmentProblem(f"GEMM backend 'deepgemm' is unavailable: {why}")
    if name not in SGLANG_BACKENDS:
        from specdash.kernels import gemm_backends

        if not name.startswith(SPECDASH_PREFIX):
            name = SPECDASH_PREFIX + name

        gemm_backends.get_backend(name.removeprefix(SPECDASH_PREFIX))
    _active = name


def sglang_batch_invariant_ops() -> Any:
    """SGLang's batch_invariant_ops module (imported on first use: it needs CUDA kernels)."""
    from specdash.runs.sglang.patches.registry import resolve

    return resolve(_OPS)


def route(original: Callable[..., Any], a: Any, b: Any, bias: Any = None, **sglang: Any) -> Any:
    """`matmul_persistent(a[M,K], b[K,N])` on the active backend; `original` is SGLang's own
    (also what diffs/ puts into SGLang's source), `sglang` its release-specific keywords
    (0.5.23: out_dtype)."""
    import torch

    name = DECODE_BACKEND if on_decode_tile(DECODE_BACKEND) else _active
    if name == "auto" or a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        return original(a, b, bias=bias, **sglang)
    if name == "sglang-triton":
        return original.__globals__["_matmul_persistent_triton"](a=a, b=b, bias=bias, **sglang)
    out_dtype = sglang.get("out_dtype") or a.dtype
    gemm = _gemm(name, original, sglang)
    w = b.transpose(0, 1)
    if name in BATCH_INVARIANT or a.shape[0] > ROWWISE_MAX_ROWS:
        out = gemm(a, w)
    else:
        out = torch.cat([gemm(a[i : i + 1], w) for i in range(a.shape[0])])
    if bias is not None:
        out = out + bias
    return out.to(out_dtype)


def on_decode_tile(tile: str) -> bool:
    """Whether the GEMM being called goes to specdash's `tile` (`DECODE_BACKEND`, or the FP8
    routing's tile): `auto` is active, this forward is not a prefill, and the tile runs here
    (else `auto` is SGLang's kernel throughout)."""
    return _active == "auto" and not prefill_forward and _runs_here(tile)


@functools.cache
def _runs_here(backend: str) -> bool:
    return specdash_backends().get(backend, "absent") is None


def mark_prefill_forwards(original: Callable[..., Any]) -> Callable[..., Any]:
    """`ModelRunner.load_model` that wraps the loaded model's `forward` so `prefill_forward`
    says, for the GEMMs inside, whether this forward is a prefill (extend without
    speculation: EXTEND, MIXED, SPLIT_PREFILL, DLLM_EXTEND). Target verify, decode, draft
    extend and idle forwards are not."""

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        self.model.forward = marking_prefill(self.model.forward)
        return result

    return load_model


def marking_prefill(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)  # keeps the signature SGLang inspects (pp_proxy_tensors)
    def marked(*args: Any, **kwargs: Any) -> Any:
        global prefill_forward
        batch = kwargs["forward_batch"] if "forward_batch" in kwargs else args[2]
        outer = prefill_forward
        prefill_forward = batch.forward_mode.is_extend_without_speculative()
        try:
            return forward(*args, **kwargs)
        finally:
            prefill_forward = outer

    return marked


def _gemm(
    name: str, original: Callable[..., Any], sglang: dict[str, Any]
) -> Callable[[Any, Any], Any]:
    """(x[M,K], w[N,K]) -> [M,N] of a backend that is not SGLang's persistent Triton."""
    if name == "deepgemm":
        deepgemm = original.__globals__["_matmul_persistent_deepgemm"]
        return lambda x, w: deepgemm(a=x, b=w.transpose(0, 1), **sglang)
    if name == "specdash-cublas":
        return cublas_unrouted
    from specdash.kernels import gemm_backends

    return gemm_backends.get_backend(name.removeprefix(SPECDASH_PREFIX))


def cublas_unrouted(x: Any, w: Any) -> Any:
    """x @ w.T on cuBLAS through `aten::addmm.out`. SGLang's deterministic mode sends
    `aten::mm`, `addmm` (and in 0.5.23 `mm.out`) to `matmul_persistent`, i.e. back into this
    router: through `F.linear`, specdash's cuBLAS backend would recurse until the CUDA graph
    recapture fails. `addmm.out` it leaves to the vendor kernel in both releases."""
    import torch

    out = x.new_empty(x.shape[0], w.shape[0])
    return torch.addmm(out, x, w.t(), beta=0, out=out)


def _routed_0_5_17(original: Callable[..., Any]) -> Callable[..., Any]:
    def matmul_persistent(a, b, bias=None):
        return route(original, a, b, bias=bias)

    matmul_persistent.__specdash_original__ = original  # type: ignore[attr-defined]
    return matmul_persistent


def _routed_0_5_23(original: Callable[..., Any]) -> Callable[..., Any]:
    def matmul_persistent(a, b, bias=None, out_dtype=None):
        return route(original, a, b, bias=bias, out_dtype=out_dtype)

    matmul_persistent.__specdash_original__ = original  # type: ignore[attr-defined]
    return matmul_persistent


def _scheduler_method(recapture: str) -> Callable[[Any], Callable[..., None]]:
    """`Scheduler.specdash_set_gemm_backend`, recapturing with ModelRunner.<recapture>()."""
    return lambda _original: _set_gemm_backend_method(recapture)


def _set_gemm_backend_method(recapture: str) -> Callable[..., None]:
    def specdash_set_gemm_backend(self: Any, name: str) -> None:
        """Runs on every scheduler rank (collective_rpc); recaptures graphs using the old kernel."""
        previous = _active
        set_backend(name)
        args = self.server_args
        if getattr(args, "disable_cuda_graph", False) or getattr(
            args, "disable_decode_cuda_graph", False
        ):
            return
        try:
            getattr(self.tp_worker.model_runner, recapture)()
        except Exception:
            set_backend(previous)
            logger.exception("CUDA graph recapture after a GEMM switch failed; switch undone")
            raise

    return specdash_set_gemm_backend


_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
_ATEN_TARGETS = (  # how deterministic mode sends aten::mm/addmm here; same in both releases
    Target(
        f"{_OPS}.mm_batch_invariant",
        "9486abaa90312dd94208755fefe18d45762aa9a76bf747f83a349031377782bb",
        role="relied on",
    ),
    Target(
        f"{_OPS}.addmm_batch_invariant",
        "7c512163d38c63e2a24c4a60c69a9ac485d95fafadf988011111be159a64dc55",
        role="relied on",
    ),
)
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_FORWARD_MODE = "sglang.srt.model_executor.forward_batch_info.ForwardMode"

PATCH = Patch(
    name="gemm_routing",
    flag="gemm",
    summary="bf16 GEMMs and lm_head through one dispatcher switchable live on every rank",
    variants={
        "0.5.17": Variant(
            targets=(
                Target(
                    f"{_OPS}.matmul_persistent",
                    "cad12a9b50278c2f2bfd8d89d359ff263880d92c55ea435ffa5bb20a1958e5c9",
                ),
                *_ATEN_TARGETS,
                Target(
                    f"{_OPS}._matmul_persistent_triton",
                    "c00bb7a2ef35f4a6f68f04e70857cd73d1b0cb63231c2afb45773d19d0f20864",
                    role="relied on",
                ),
                Target(
                    f"{_OPS}._matmul_persistent_deepgemm",
                    "f0b2c2b99a0e4fc851c51f59153e085f71e1864bdca4d3668edf57d6d9a53b8d",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
                    "d4f4982c2c3ded720bf01e67a55c9ebfca273dbb2036a8662c164a3d7cc1c26b",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head",
                    "fdfd5700da47e7b49a6f0c4bb7d6ca9e685a6abd56088c527ab9abe612413633",
                    role="relied on",
                ),
                Target(
                    f"{_SCHEDULER}.handle_rpc_request",
                    "b14ebf76765559b6c3674aca142929adf53fe108fdc1d022299a6f7bd859bf61",
                    role="relied on",
                ),
                Target(
                    f"{_RUNNER}.load_model",
                    "6fbe26943e7eea341c7088f0d1abd90812e1625514a09dcfe944cce5cfc06423",
                ),
                Target(
                    f"{_FORWARD_MODE}.is_extend_without_speculative",
                    "3f6ec29c9cf7bbf7d03cebd8355e6ceb2c9a584d4f8a352591b2d4eef15d9037",
                    role="relied on",
                ),
                Target(
                    f"{_RUNNER}.init_decode_cuda_graph",
                    "a8493cc1e36f0dc8c3a38088f62b14034499dc70360318bda47ed8dd3a110e6f",
                    role="relied on",
                ),
            ),
            rebindings=(
                Rebinding(_OPS, "matmul_persistent", _routed_0_5_17),
                Rebinding(_RUNNER, "load_model", mark_prefill_forwards),
                Rebinding(
                    _SCHEDULER,
                    "specdash_set_gemm_backend",
                    _scheduler_method("init_decode_cuda_graph"),
                    adds=True,
                ),
            ),
        ),
        "0.5.23": Variant(
            targets=(
                Target(
                    f"{_OPS}.matmul_persistent",
                    "c00077f7a4ccd52518a7c33f61540d5e15e877a4dbb686231e70d3fdb6accca8",
                ),
                *_ATEN_TARGETS,
                Target(
                    f"{_OPS}._matmul_persistent_triton",
                    "063823de1bd3e2ccbac66a9b63ff2da3993f0388b5110bdf0d41b45b7c82857b",
                    role="relied on",
                ),
                Target(
                    f"{_OPS}._matmul_persistent_deepgemm",
                    "fbda7355c0721e81d1302d7adb6e43ae8525e1a6ee63137280732528d7025114",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
                    "7a9dc32424991c10f709a65b34c71e6f334b59fcb9be544fab26edeb8d6912e0",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head",
                    "edee85644b6ea8a99d4c6c0084e72114bdd8e5512387c9157e0a72dfd8662379",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.managers.scheduler.Scheduler.handle_rpc_request",
                    "b14ebf76765559b6c3674aca142929adf53fe108fdc1d022299a6f7bd859bf61",
                    role="relied on",
                ),
                Target(
                    f"{_RUNNER}.load_model",
                    "655a134e49f25ec12d8da45f4aa1071022a448fea69c7bcbc3f692cf3f33665f",
                ),
                Target(
                    f"{_FORWARD_MODE}.is_extend_without_speculative",
                    "3f6ec29c9cf7bbf7d03cebd8355e6ceb2c9a584d4f8a352591b2d4eef15d9037",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.model_executor.model_runner.ModelRunner.recapture_decode_cuda_graph",
                    "982811a5f460dcb7d84058eeb163f92ef37b4abe1cec22500943182c17b6fbf8",
                    role="relied on",
                ),
            ),
            rebindings=(
                Rebinding(_OPS, "matmul_persistent", _routed_0_5_23),
                Rebinding(_RUNNER, "load_model", mark_prefill_forwards),
                Rebinding(
                    _SCHEDULER,
                    "specdash_set_gemm_backend",
                    _scheduler_method("recapture_decode_cuda_graph"),
                    adds=True,
                ),
            ),
        ),
    },
)
