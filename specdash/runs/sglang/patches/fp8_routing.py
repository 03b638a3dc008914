"""FP8 GEMMs in one M-independent kernel configuration, so a row's bits do not depend on its batch.

Why: FP8 linears never reach `matmul_persistent` (gemm_routing's dispatcher). Online FP8
(`quantization=fp8` on a bf16 checkpoint) and `w8a8_fp8` quantize each activation row with its
own scale (batch-invariant), then call the module global `fp8_utils.fp8_scaled_mm`: sgl_kernel's
CUTLASS kernel, which picks one of eight compiled configurations by M. For M <= 64 it swaps A
and B, and the epilogue then rounds `ws * (xs * acc)` instead of `xs * (ws * acc)` in fp32; 65..128
and > 128 are two more configurations. A verify of 8 requests (M = 8 (k+1)) and the shadow's decode
of one (M = 1), or a prefill of several prompts and of one, land in different configurations and
differ in the last bit, and the text follows after a few tokens.

The patch, per-channel (`fp8_scaled_mm` rebound in `fp8_utils`, the one name every caller of
`apply_fp8_linear` and `W8A8Fp8LinearMethod` looks up at call time): a call with M < PAD_ROWS is
padded to PAD_ROWS rows (zero rows, unit scales) and sliced back, and every call goes to the
AOT `sgl_kernel.fp8_scaled_mm` directly. Every FP8 GEMM then runs CUTLASS's single `M > 128`
configuration: data-parallel persistent tiles, no split-K, K accumulated in order, so each row's
bits depend only on its own data. 0.5.23's `fp8_scaled_mm` is a registry op that sends big
prefills (M >= 8192) to `torch._scaled_mm` (cuBLASLt heuristics): that second M switch is
bypassed by calling the AOT op. No split by forward mode is needed: every mode meets the same
configuration (decode and verify pay for padding to PAD_ROWS rows: the FP8 MMA work of two
128-row tiles, a fraction of streaming the weight).

Block FP8 (checkpoints quantized with `weight_block_size` [128, 128]): SGLang's Triton
`w8a8_block_fp8_matmul_triton` runs one default configuration for every M unless a tuned JSON
for (N, K, the card) exists, and then picks the JSON's entry nearest M (0.5.23's may also choose
split-K or swap-AB per M). `get_w8a8_block_fp8_configs` is pinned to None, the default for every
M, so a JSON shipped later cannot make the path batch-variant.

Environment (`PINNED_ENV`, set where the session's environment reaches SGLang's processes):
`USE_TRITON_W8A8_FP8_KERNEL` would divert per-channel FP8 to `triton_scaled_mm`, whose tiles are
chosen by M; 0.5.23's `SGLANG_ENABLE_FP8_GEMM_CONFIG_TUNE` picks tuned Triton tiles by nearest M.
Both are pinned off while this patch is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdash.runs.sglang.patches.registry import Patch, Rebinding, Target, Variant

PAD_ROWS = 129
"""Rows every per-channel FP8 GEMM runs with at least: CUTLASS's `M > 128` configuration."""
PINNED_ENV = {"USE_TRITON_W8A8_FP8_KERNEL": "0", "SGLANG_ENABLE_FP8_GEMM_CONFIG_TUNE": "0"}
"""SGLang's FP8 switches that select M-dependent kernels, pinned off in its processes."""

_UTILS = "sglang.srt.layers.quantization.fp8_utils"


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


def _padding(_original: Callable[..., Any]) -> Callable[..., Any]:
    padded_scaled_mm.__specdash_original__ = _original  # type: ignore[attr-defined]
    return padded_scaled_mm


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
            Rebinding(_UTILS, "fp8_scaled_mm", _padding, if_bound=True),  # bound on CUDA only
            Rebinding(block_kernel, "get_w8a8_block_fp8_configs", default_block_configs),
        ),
    )


PATCH = Patch(
    name="fp8_routing",
    flag="fp8",
    summary="FP8 GEMMs in one CUTLASS configuration for every M; block-FP8 on its default tile",
    variants={
        "0.5.17": _variant(
            "sglang.kernels.ops.quantization.fp8_kernel",
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
            "sglang.kernels.ops.gemm.fp8_kernel",
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
