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
- replaces the module global `causal_conv1d_triton._causal_conv1d_update_kernel` (the Triton
  kernel `causal_conv1d_update` launches) with a copy whose draft-tree branch sums the conv
  taps in decode's order (0.5.17 and 0.5.23: the same text in both). Target verify runs the
  conv through `causal_conv1d_update` with SGLang's tree links whenever the draft is a tree
  (topk > 1: NGRAM at its default breadth). That branch walks token, parent, grand-parent
  and adds x*w3 + p*w2 + gp*w1 + ggp*w0 in that order; decode (`causal_conv1d_update` on one
  token, or on CUDA in 0.5.23 `fused_qkvzba_causal_conv1d_update_contiguous`, the same
  order) adds ggp*w0 + gp*w1 + p*w2 + x*w3 onto bias-or-zero. Same bf16 products, another
  fp32 summation order: 1-ulp differences. The copy walks the same path, saves the same
  windows and parents, records the taps and adds them oldest first, as decode does for that
  path's window. Chain verify (links None) already sums in decode's order.
It must be applied before `GDNKernelDispatcher` is built (it caches the flag), i.e. before
the Scheduler exists (the conv kernel before any CUDA graph capture); run with
`linear_attn_backend=triton` and `mamba_ssm_dtype=float32`. The conv state dtype must be the
model's (SGLang's default bf16): decode reads the window from the conv state, the tree from x.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdash.runs.sglang.patches.registry import (
    Patch,
    Rebinding,
    Target,
    Variant,
    compiled_from_edited,
    edited_source,
)

_KERNEL = "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel"
_LAUNCH_MODULE = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"
_BACKEND = "sglang.srt.layers.attention.linear.gdn_backend"
_CONV = "sglang.kernels.ops.mamba.causal_conv1d_triton"


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


TREE_TAPS_IN_DECODE_ORDER: tuple[tuple[str, str], ...] = (
    # (SGLang's text in `_causal_conv1d_update_kernel`'s tree branch, its replacement); each
    # occurs once. 1: the walk no longer picks a weight per step (tap j = j-th ancestor).
    (
        """\
            for j in tl.static_range(KERNEL_WIDTH):
                if KERNEL_WIDTH == 2:
                    if j == 0:
                        matrix_w = w_col1
                    else:
                        matrix_w = w_col0
                elif KERNEL_WIDTH == 3:
                    if j == 0:
                        matrix_w = w_col2
                    elif j == 1:
                        matrix_w = w_col1
                    else:
                        matrix_w = w_col0
                elif KERNEL_WIDTH == 4:
                    if j == 0:
                        matrix_w = w_col3
                    elif j == 1:
                        matrix_w = w_col2
                    elif j == 2:
                        matrix_w = w_col1
                    else:
                        matrix_w = w_col0

                if SAVE_INTERMEDIATE:
""",
        """\
            # specdash gdn_verify_as_decode: walk itself, parent, grand-parent, ... recording
            # the taps (tap0 = itself), then add them in decode's order, oldest first.
            for j in tl.static_range(KERNEL_WIDTH):
                if SAVE_INTERMEDIATE:
""",
    ),
    # 2: record the tap instead of adding it.
    (
        """\
                acc += matrix_x * matrix_w

                # move to parent for next iteration
""",
        """\
                if j == 0:
                    tap0 = matrix_x
                elif j == 1:
                    tap1 = matrix_x
                elif j == 2:
                    tap2 = matrix_x
                elif j == 3:
                    tap3 = matrix_x

                # move to parent for next iteration
""",
    ),
    # 3: after the walk, decode's sum: the chain branch's `acc += matrix_x * matrix_w` order.
    (
        """\
                    _idx_token = _idx_token - 1
        else:
""",
        """\
                    _idx_token = _idx_token - 1
            if KERNEL_WIDTH == 2:
                acc += tap1 * w_col0
                acc += tap0 * w_col1
            elif KERNEL_WIDTH == 3:
                acc += tap2 * w_col0
                acc += tap1 * w_col1
                acc += tap0 * w_col2
            elif KERNEL_WIDTH == 4:
                acc += tap3 * w_col0
                acc += tap2 * w_col1
                acc += tap1 * w_col2
                acc += tap0 * w_col3
        else:
""",
    ),
)


def tree_taps_in_decode_order(source: str) -> str:
    """SGLang's `causal_conv1d_triton` source (the module or the kernel) with the kernel's tree
    branch summing in decode's order; ValueError when a replaced text is not there once."""
    return edited_source(source, TREE_TAPS_IN_DECODE_ORDER, "gdn_verify_as_decode: conv tree text")


def _conv_kernel_in_decode_order(original: Any) -> Any:
    """A copy of the `@triton.jit` conv update kernel, compiled from its patched source in a
    copy of its module's globals."""
    kernel = compiled_from_edited(original.fn, TREE_TAPS_IN_DECODE_ORDER, "gdn_verify_as_decode")
    kernel.__specdash_original__ = original
    return kernel


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
    summary="decode and target-verify share the fp32-beta recurrent GDN step and launch, "
    "and the conv on a draft tree sums its taps in decode's order",
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
                Target(
                    f"{_CONV}._causal_conv1d_update_kernel",
                    "856c2f63927dae71c07f757e4acdc5598aaa4dbeb18310c3d18f6a3ab984a8a0",
                ),
                Target(
                    f"{_CONV}.causal_conv1d_update",
                    "e007f8ea244829e256dfb1a9c3cd53bac982431e30e54d1291a4b4702d84071e",
                    role="relied on",
                ),
                Target(
                    f"{_BACKEND}.GDNAttnBackend.forward_extend",
                    "bbf20e5fb965f73bfc5cab3c48e67af2b7b8200f3062f80466f3d8d9af8e3b46",
                    role="relied on",
                ),
            ),
            rebindings=(
                Rebinding(_KERNEL, "supports_packed_decode", lambda _original: False),
                Rebinding(_CONV, "_causal_conv1d_update_kernel", _conv_kernel_in_decode_order),
            ),
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
                Target(
                    f"{_CONV}._causal_conv1d_update_kernel",
                    "f4e344d8823fa83a1abf0436b872a36cd3053d5b495e79d7f1a6d0baf7cdb0de",
                ),
                Target(
                    f"{_CONV}.causal_conv1d_update",
                    "9deee5a1f64dea91cfb7c90eea14ea8460013b26d314416f8094652619b34c88",
                    role="relied on",
                ),
                Target(
                    f"{_BACKEND}.GDNAttnBackend.forward_extend",
                    "41563017bfb3c1644f2523fca728a3966842a076214471c468b49a4070b54fd5",
                    role="relied on",
                ),
                Target(  # decode's conv on CUDA: the update kernel's decode order, fused
                    "sglang.kernels.ops.attention.triton_gdn_fused_proj"
                    "._fused_qkvzba_causal_conv1d_update_contiguous_kernel",
                    "3eaec0b3139b0c5cf6b1ab09364735c5939d87685bf4b7406670e6bb43256061",
                    role="relied on",
                ),
            ),
            rebindings=(
                Rebinding(_KERNEL, "supports_packed_decode", lambda _original: False),
                Rebinding(_LAUNCH_MODULE, "_select_recurrent_launch_config", _pinned_launch_config),
                Rebinding(_CONV, "_causal_conv1d_update_kernel", _conv_kernel_in_decode_order),
            ),
        ),
    },
)
