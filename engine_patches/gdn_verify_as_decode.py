"""GDN verify = decode: both modes run the same recurrent Triton step.

Why: in SGLang 0.5.23 a decode step goes through the *packed* kernel
(`fused_recurrent_gated_delta_rule_packed_decode`, beta rounded to bf16), while
target-verify goes through `fused_sigmoid_gating_delta_rule_update` (beta = sigmoid(b)
in fp32), and on SM90 verify also gets a narrower launch (BV=4, one warp) than decode
(BV=32). Either difference moves the fp32 state and the output bits, so a verified token can
differ from the token plain decode would give.

The patch:
- replaces `TritonGDNKernel.supports_packed_decode` (True) with False, so
  `GDNAttnBackend.forward_decode` takes its non-packed branch,
  `TritonGDNKernel.decode` -> `fused_sigmoid_gating_delta_rule_update`, the verify kernel,
  with its fp32 in-kernel beta (0.5.17 and 0.5.23);
- 0.5.23 only: replaces the module global
  `fused_sigmoid_gating_recurrent._select_recurrent_launch_config` with one that gives GDN
  (not KDA) the decode launch `(min(32, next_pow2(V)), 1)` in both modes. In 0.5.17 the
  kernel (then under `sglang.kernels.ops.attention.fla`) launches BV=min(32, next_pow2(V)),
  one warp, for decode and verify alike, so there is nothing to pin.
It must be applied before `GDNKernelDispatcher` is built (it caches the flag), i.e. before
the Scheduler exists; run with `linear_attn_backend=triton` and `mamba_ssm_dtype=float32`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdash.engine_patches.registry import Patch, Rebinding, Target, Variant

_KERNEL = "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel"
_LAUNCH_MODULE = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"
_BACKEND = "sglang.srt.layers.attention.linear.gdn_backend"


def decode_launch_config(v: int) -> tuple[int, int]:
    """(BV, num_warps) SGLang uses for GDN decode on CUDA."""
    return min(1 << max(v - 1, 0).bit_length(), 32), 1


def _pinned_launch_config(original: Callable[..., tuple[int, int]]) -> Callable[..., Any]:
    def _select_recurrent_launch_config(
        n: int,
        h: int,
        hv: int,
        k: int,
        v: int,
        is_kda: bool,
        target_verify: bool = False,
        *,
        cache_steps: int = 0,
    ) -> tuple[int, int]:
        if is_kda:
            return original(
                n, h, hv, k, v, is_kda, target_verify=target_verify, cache_steps=cache_steps
            )
        return decode_launch_config(v)

    _select_recurrent_launch_config.__specdash_original__ = original  # type: ignore[attr-defined]
    return _select_recurrent_launch_config


_KERNEL_TARGETS = (  # the same source in 0.5.17 and 0.5.23
    Target(
        f"{_KERNEL}.supports_packed_decode",
        "1ee3ea11f0d4259120747f17416013bcc980f83c88554c515f97fb19e3c40661",
    ),
    Target(
        f"{_KERNEL}.decode",
        "7b67575fa89a435acbf5d47f46168450b96e3357ca43bccaecb365c6c3a6400b",
        role="relied on",
    ),
    Target(
        f"{_KERNEL}.target_verify",
        "f58870c63e58012144dd4e04add7630fc2efbbb1ed6deb1ed9f84c151306c5fc",
        role="relied on",
    ),
)

PATCH = Patch(
    name="gdn_verify_as_decode",
    flag="gdn",
    summary="decode and target-verify share the fp32-beta recurrent GDN step and launch",
    variants={
        "0.5.17": Variant(
            targets=(
                *_KERNEL_TARGETS,
                Target(
                    f"{_BACKEND}.GDNKernelDispatcher.__init__",
                    "db28e1ff2858be409f3170c54f05301182c4796765eae1e7ba05e7f0837097a0",
                    role="relied on",
                ),
                Target(
                    f"{_BACKEND}.GDNAttnBackend.forward_decode",
                    "50a78e1835d8c0137a50b77900ca73ad25fc619782b504949abace2271531ad5",
                    role="relied on",
                ),
                Target(
                    "sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent"
                    ".fused_sigmoid_gating_delta_rule_update",
                    "047ca40c8c53abf2a3edddf4e87e041899d80bc1a89ec17c15d28bb07cd1f9da",
                    role="relied on",
                ),
            ),
            rebindings=(Rebinding(_KERNEL, "supports_packed_decode", lambda _original: False),),
        ),
        "0.5.23": Variant(
            targets=(
                *_KERNEL_TARGETS,
                Target(
                    f"{_BACKEND}.GDNKernelDispatcher.__init__",
                    "9d26668b7ef2887bd6bd5db710ff6ff325396f8be36c1205066267719ce7a034",
                    role="relied on",
                ),
                Target(
                    f"{_BACKEND}.GDNAttnBackend.forward_decode",
                    "80fb76f13520d30da82810266f057edf069429ef9e24f15da4fae3c14b7dbd8d",
                    role="relied on",
                ),
                Target(
                    f"{_LAUNCH_MODULE}._select_recurrent_launch_config",
                    "a9cc86eabad88126ca8c1944792ecb9d0416404066e37504a099ce1e926d4ef0",
                ),
            ),
            rebindings=(
                Rebinding(_KERNEL, "supports_packed_decode", lambda _original: False),
                Rebinding(_LAUNCH_MODULE, "_select_recurrent_launch_config", _pinned_launch_config),
            ),
        ),
    },
)
