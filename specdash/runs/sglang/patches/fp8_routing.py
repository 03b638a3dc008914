"""FP8 GEMMs on batch-invariant kernels, split by forward mode as the bf16 routing is, so a row's
bits do not depend on its batch.

Why: FP8 linears never reach `matmul_persistent` (gemm_routing's dispatcher). Online FP8
(`quantization=fp8` on a bf16 checkpoint) and `w8a8_fp8` quantize each activation row with its
own scale (batch-invariant), then call the module global `fp8_utils.fp8_scaled_mm`: sgl_kernel's
CUTLASS kernel, which picks one of eight compiled configurations by M. For M <= 64 it swaps A
and B, and the epilogue then rounds `ws * (xs * acc)` instead of `xs * (ws * acc)` in fp32; 65..128
and > 128 are two more configurations. A verify of 8 requests (M = 8 (k+1)) and the shadow's decode
of one (M = 1), or a prefill of several prompts and of one, land in different configurations and
differ in the last bit, and the text follows after a few tokens. Block FP8 (checkpoints quantized
with `weight_block_size` [128, 128]) quantizes each row per 128-column group and calls the module
global `fp8_utils.w8a8_block_fp8_matmul_triton`, whose tile a tuned JSON for (N, K, the card)
picks by nearest M (0.5.23's may also choose split-K or swap-AB per M).

The routes (`routed_scaled_mm`, `routed_block_matmul`, rebound in `fp8_utils`, the names every
caller looks up at call time), by the forward `gemm_routing` marks and its live backend:
* under `auto`, every forward that is not a prefill (decode, target verify, draft) runs
  specdash's FP8 tile (`kernels/triton/gemm_fp8.py`: BLOCK_M 16, one configuration per (N, K),
  K in order, a fixed split-K): a verify row and the decode row it must equal meet the same
  kernel at any batch, and the tile streams the weight at decode's M near HBM bandwidth;
* prefill (and every forward under another backend) runs SGLang's kernels made M-independent:
  per channel, a call with M < PAD_ROWS is padded to PAD_ROWS rows (zero rows, unit scales),
  sliced back, on the AOT `sgl_kernel.fp8_scaled_mm`, so it always meets CUTLASS's single
  `M > 128` configuration (data-parallel persistent tiles, no split-K, K accumulated in order;
  the AOT call also bypasses 0.5.23's registry switch to `torch._scaled_mm` for M >= 8192);
  block, SGLang's Triton kernel with `get_w8a8_block_fp8_configs` pinned to None, the default
  tile for every M, so a JSON shipped later cannot make the path batch-variant.
A prefill of several prompts and of one then have the same rows, and so do a verify and a decode.

Environment (`PINNED_ENV`, set where the session's environment reaches SGLang's processes):
`USE_TRITON_W8A8_FP8_KERNEL` would divert per-channel FP8 to `triton_scaled_mm`, whose tiles are
chosen by M; 0.5.23's `SGLANG_ENABLE_FP8_GEMM_CONFIG_TUNE` picks tuned Triton tiles by nearest M.
Both are pinned off while this patch is on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from specdash.runs.sglang.patches import gemm_routing
from specdash.runs.sglang.patches.registry import (
    Patch,
    Rebinding,
    Target,
    Variant,
    patch_row,
    resolve,
)

PAD_ROWS = 129
"""Rows every per-channel FP8 GEMM runs with at least: CUTLASS's `M > 128` configuration."""
PINNED_ENV = {"USE_TRITON_W8A8_FP8_KERNEL": "0", "SGLANG_ENABLE_FP8_GEMM_CONFIG_TUNE": "0"}
"""SGLang's FP8 switches that select M-dependent kernels, pinned off in its processes."""

TILE = f"{gemm_routing.SPECDASH_PREFIX}triton-fp8"
"""The backend whose FP8 GEMMs `auto` runs every non-prefill FP8 GEMM on."""
_UTILS = "sglang.srt.layers.quantization.fp8_utils"
BLOCK_KERNEL = {
    "0.5.17": "sglang.kernels.ops.quantization.fp8_kernel",
    "0.5.23": "sglang.kernels.ops.gemm.fp8_kernel",
}
"""Per SGLang release, the module holding the block-FP8 Triton GEMM and its config lookup."""


def padded_scaled_mm(
    mat_a: Any, mat_b: Any, scales_a: Any, scales_b: Any, out_dtype: Any, bias: Any = None
) -> Any:
    """`fp8_scaled_mm(mat_a[M,K] fp8, mat_b[K,N] fp8, scales_a[M,1] (or one), scales_b[1,N])`
    on sgl_kernel's CUTLASS op with at least PAD_ROWS rows, so it always takes the same
    configuration; the rows past M are zeros and are dropped."""
    import sgl_kernel

    m = mat_a.shape[0]
    if m >= PAD_ROWS:
        return sgl_kernel.fp8_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype, bias)
    a = mat_a.new_zeros(PAD_ROWS, mat_a.shape[1])
    a[:m] = mat_a
    s = scales_a.new_ones(PAD_ROWS, 1)
    s[:m] = scales_a.reshape(-1, 1)  # a per-tensor scale broadcasts over the M rows
    return sgl_kernel.fp8_scaled_mm(a, mat_b, s, scales_b, out_dtype, bias)[:m]


def routed_scaled_mm(
    mat_a: Any, mat_b: Any, scales_a: Any, scales_b: Any, out_dtype: Any, bias: Any = None
) -> Any:
    """`fp8_scaled_mm` on the FP8 tile (decode, verify, draft under `auto`), else padded."""
    if gemm_routing.on_decode_tile(TILE):
        return _tile().scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype, bias)
    return padded_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype, bias)


def routed_block_matmul(
    A: Any,  # noqa: N803 (SGLang's names)
    B: Any,  # noqa: N803
    As: Any,  # noqa: N803
    Bs: Any,  # noqa: N803
    block_size: list[int],
    output_dtype: Any = None,
) -> Any:
    """`w8a8_block_fp8_matmul_triton` on the FP8 tile (decode, verify, draft under `auto`, with
    the [128, 128] blocks it runs), else SGLang's kernel on its default tile."""
    import torch

    dtype = output_dtype or torch.float16  # SGLang's default
    if list(block_size) == [128, 128] and gemm_routing.on_decode_tile(TILE):
        return _tile().block_matmul(A, B, As, Bs, block_size, dtype)
    return _sglang_block_matmul()(A, B, As, Bs, block_size, output_dtype=dtype)


@functools.cache
def _sglang_block_matmul() -> Callable[..., Any]:
    """SGLang's own block GEMM, looked up once: every prefill GEMM comes through here, and
    finding the release reads the installed package's metadata."""
    return resolve(f"{BLOCK_KERNEL[patch_row()]}.w8a8_block_fp8_matmul_triton")


def _tile() -> Any:
    from specdash.kernels import gemm_backends

    return gemm_backends.get_fp8_backend(TILE.removeprefix(gemm_routing.SPECDASH_PREFIX))


def _routed(route: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(_original: Callable[..., Any]) -> Callable[..., Any]:
        route.__specdash_original__ = _original  # type: ignore[attr-defined]
        return route

    return make


def default_block_configs(_original: Callable[..., Any]) -> Callable[..., None]:
    """`get_w8a8_block_fp8_configs` that finds no tuned table: the default config for every M."""

    def get_w8a8_block_fp8_configs(N: int, K: int, block_n: int, block_k: int) -> None:
        return None

    return get_w8a8_block_fp8_configs


def _variant(block_kernel: str, hashes: dict[str, str], extra: tuple[Target, ...] = ()) -> Variant:
    """One release's targets; `block_kernel` is the module holding the block-FP8 Triton GEMM."""
    return Variant(
        targets=(
            Target(f"{_UTILS}.fp8_scaled_mm", hashes["fp8_scaled_mm"]),
            Target(f"{_UTILS}.apply_fp8_linear", hashes["apply"], role="relied on"),
            Target(f"{_UTILS}.use_triton_w8a8_fp8_kernel", hashes["use_triton"], role="relied on"),
            Target(
                f"{_UTILS}.triton_w8a8_block_fp8_linear", hashes["block_linear"], role="relied on"
            ),
            Target(f"{block_kernel}.get_w8a8_block_fp8_configs", hashes["block_configs"]),
            Target(
                f"{block_kernel}.w8a8_block_fp8_matmul_triton",
                hashes["block_matmul"],
                role="relied on",
            ),
            *extra,
        ),
        rebindings=(
            # bound on CUDA only
            Rebinding(_UTILS, "fp8_scaled_mm", _routed(routed_scaled_mm), if_bound=True),
            Rebinding(block_kernel, "get_w8a8_block_fp8_configs", default_block_configs),
            Rebinding(_UTILS, "w8a8_block_fp8_matmul_triton", _routed(routed_block_matmul)),
        ),
    )


PATCH = Patch(
    name="fp8_routing",
    flag="fp8",
    summary="FP8 decode/verify GEMMs on the FP8 tile; prefill on M-independent SGLang kernels",
    variants={
        "0.5.17": _variant(
            BLOCK_KERNEL["0.5.17"],
            {
                "fp8_scaled_mm": "18f899ca972a4c34dbcd75e03d0dde582961c3f6ef36d8d78af46bc00d81c942",
                "apply": "898bf3a5f8ff2e3262734cf86344947bb5babe23cf94db84a5385ff93ef0ac3b",
                "use_triton": "49c11fa4c29f8da8b4fe5bd4a3d3c42fbfffbccb997383658bc154291c71f1bd",
                "block_linear": "4fe8e91188d11c61a1d5064254a337c77b65ee1b3a85dcf9d060d18901930952",
                "block_configs": "a4b4f552d119b1b25a56632f578386540b08e6564dcf36377d978540b3e41a12",
                "block_matmul": "1a09b8a12952f93a55996d254d01e455238d8d9eb89cc69cb68bf7e768a20c12",
            },
        ),
        "0.5.23": _variant(
            BLOCK_KERNEL["0.5.23"],
            {
                "fp8_scaled_mm": "d7c9e82fbaebe6ea249795b5c842a4297bcb48234df16e5e700721f517479e7e",
                "apply": "28683ebce40f13fb923586b735bab708eec838e97cc74f45040da63e5d83cf29",
                "use_triton": "49c11fa4c29f8da8b4fe5bd4a3d3c42fbfffbccb997383658bc154291c71f1bd",
                "block_linear": "ecee6e47e06ddcbbd3ae710f32f8bebb85965b2459fc8f265564f26ff174ae76",
                "block_configs": "a4b4f552d119b1b25a56632f578386540b08e6564dcf36377d978540b3e41a12",
                "block_matmul": "cfee408d7549735edcd83bd5f430259ecbab1b7b08046c5f09db705717d33f47",
            },
            extra=(  # the registry op the AOT call bypasses (its torch._scaled_mm switch)
                Target(
                    "sglang.kernels.ops.gemm.Fp8ScaledMMOp",
                    "7db58dd69bb497bca38a0b1574fe135bb79985f57768f4908e32382a83351c8a",
                    role="relied on",
                ),
            ),
        ),
    },
)
