"""Compile every row kernel for a Hopper GPU (sm_90) on a machine without one.

Run with TRITON_INTERPRET=0 (so the kernels are real JIT functions): each wrapper is called on
small CPU tensors with `JITFunction.run` replaced by an offline `triton.compile` for
GPUTarget("cuda", 90, 32) with the launch's own signature, constexprs and num_warps, down to a
cubin (ptxas included). The interpreter tests check the arithmetic; this checks that the same
source goes through Triton's GPU compiler, which the interpreter never runs. Prints one line per
kernel and exits 1 if any failed.
"""

from __future__ import annotations

import sys
import traceback

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

TARGET = GPUTarget("cuda", 90, 32)
TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.int32: "*i32",
    torch.int64: "*i64",
    torch.float8_e4m3fn: "*fp8e4nv",
}
OPTIONS = ("num_warps", "num_stages", "launch_pdl")
compiled: dict[str, str] = {}


def _type(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return TYPES[value.dtype]
    if isinstance(value, TensorDescriptor):
        block = ", ".join(map(str, value.block_shape))
        return f"tensordesc<{TYPES[value.base.dtype][1:]}[{block}]>"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def offline_run(self: JITFunction, *args, grid, warmup, **kwargs):
    name = self.fn.__name__ + ("", " (PDL)", " (early PDL)")[kwargs.get("PDL", 0)]
    options = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
    bound = dict(zip(self.arg_names[: len(args)], args, strict=True)) | kwargs
    signature, constexprs = {}, {}
    for p in self.params:
        value = bound[p.name]
        if p.is_constexpr:
            signature[p.name], constexprs[p.name] = "constexpr", value
        else:
            signature[p.name] = _type(value)
    try:
        source = ASTSource(self, signature, constexprs)
        kernel = triton.compile(source, target=TARGET, options=options)
        compiled.setdefault(name, f"ok ({len(kernel.asm['cubin'])} B cubin)")
    except Exception:
        compiled[name] = "FAILED\n" + traceback.format_exc(limit=3)


def main() -> int:
    JITFunction.run = offline_run
    from specdash.kernels.triton import pdl

    for mode in (pdl.OFF, pdl.LATE, pdl.EARLY):  # plain launches, then each PDL mode
        pdl.use_pdl = lambda device, mode=mode: mode
        launch_all()
    for name, result in sorted(compiled.items()):
        print(f"{name}: {result}")
    print(f"triton {triton.__version__}, target {TARGET}")
    return 0 if compiled and all(r.startswith("ok") for r in compiled.values()) else 1


def launch_all() -> None:
    from specdash.kernels.triton import gemm
    from specdash.kernels.triton.decode_attention import verify_as_decode_rows
    from specdash.kernels.triton.elementwise import (
        causal_conv_silu_in_place,
        causal_conv_silu_rows,
        sigmoid_gate_rows,
        swiglu_rows,
    )
    from specdash.kernels.triton.gdn import (
        conv_gdn_steps_in_place,
        gdn_steps_in_place,
        gdn_verify_steps,
    )
    from specdash.kernels.triton.gemm import GemmConfig
    from specdash.kernels.triton.rmsnorm import (
        add_rms_norm_rows,
        gated_rms_norm_rows,
        rms_norm_rows,
    )
    from specdash.kernels.triton.rope import qk_norm_rope_rows

    bf = torch.bfloat16
    x = torch.randn(3, 256, dtype=bf)
    w = torch.randn(256, dtype=bf)
    rms_norm_rows(x, w, 1e-6, True)
    add_rms_norm_rows(x, x, w, 1e-6, True)
    heads = torch.randn(3, 4, 128, dtype=bf)
    gated_rms_norm_rows(heads, heads, w[:128], 1e-6)
    swiglu_rows(torch.randn(3, 512, dtype=bf))
    sigmoid_gate_rows(heads, heads)
    causal_conv_silu_rows(torch.randn(3, 256, dtype=bf), x, torch.randn(256, 4, dtype=bf))
    causal_conv_silu_in_place(torch.randn(3, 256, dtype=bf), x[:1], torch.randn(256, 4, dtype=bf))
    hq, hkv, d, cap = 4, 2, 64, 512
    cache = torch.zeros(hkv, cap, d, dtype=bf)
    table = torch.randn(cap, 32, dtype=bf)
    position = torch.zeros(1, dtype=torch.int64)
    qkv = torch.randn(3, hq * 2 * d + 2 * hkv * d, dtype=bf)
    q = qk_norm_rope_rows(qkv, hq, hkv, True, w[:d], w[:d], 1e-6, True, table, table, position,
                          cache, cache)  # fmt: skip
    verify_as_decode_rows(q[None], cache[None], cache[None], position, d**-0.5)
    t, h, hv, dk, dv = 3, 2, 4, 128, 128
    for steps in (gdn_verify_steps, gdn_steps_in_place):  # per-step states, or in place
        steps(
            torch.randn(1, t, h, dk, dtype=bf),
            torch.randn(1, t, h, dk, dtype=bf),
            torch.randn(1, t, hv, dv, dtype=bf),
            torch.randn(1, t, hv, dtype=bf),
            torch.randn(1, t, hv, dtype=bf),
            torch.randn(hv),
            torch.randn(hv),
            torch.zeros(1, hv, dk, dv),
        )
    c = 2 * h * dk + hv * dv  # the conv fused into the in-place step, on pool slots
    conv_gdn_steps_in_place(
        torch.randn(2, c, dtype=bf), torch.randn(2, hv, dtype=bf), torch.randn(2, hv, dtype=bf),
        torch.randn(c, 4, dtype=bf), torch.randn(hv), torch.randn(hv),
        torch.randn(3, 3, c, dtype=bf), torch.zeros(3, hv, dk, dv), slots=torch.tensor([2, 0]),
    )  # fmt: skip
    # the GEMM wrapper refuses a CPU device outside the interpreter: call its launch, for a
    # pointer-load config and a TMA one with split-K, plain and with each prologue; the
    # gate_up shape's config and a split one with the SwiGLU epilogue
    wt = torch.randn(192, 512, dtype=bf)
    heads = torch.randn(3, 4, 128, dtype=bf)
    for cfg in (GemmConfig(64, 128, 1), GemmConfig(64, 128, 2, num_stages=3, tma=True)):
        gemm.launch(torch.randn(3, 512, dtype=bf), wt, cfg, None)
        gemm.launch(torch.randn(3, 1024, dtype=bf), wt, cfg, gemm.SwiGLU())
        gemm.launch(heads.view(3, 512), wt, cfg, gemm.SigmoidGate(heads))
        gemm.launch(heads.view(3, 512), wt, cfg, gemm.GatedRmsNorm(heads, w[:128], 1e-6))
    for cfg in (GemmConfig(64, 64, 1, num_stages=3), GemmConfig(64, 128, 2)):  # SwiGLU epilogue
        gemm.launch(torch.randn(3, 512, dtype=bf), wt, cfg, None, swiglu_out=True)
    # the FP8 tile (its wrapper, too, refuses a CPU device outside the interpreter): the block
    # layout, split or not, the per-channel layout, and the row quantization per 128-column
    # group and per token
    from specdash.kernels.fp8 import quantize_blocks
    from specdash.kernels.triton import gemm_fp8
    from specdash.kernels.triton.gemm_fp8 import Fp8GemmConfig

    gemm_fp8._interpretable = lambda device: None
    q, s = quantize_blocks(torch.randn(192, 1024))
    xq, xs = gemm_fp8.quantize_rows(torch.randn(3, 1024, dtype=bf))
    gemm_fp8.quantize_rows(torch.randn(3, 1024, dtype=bf), None)
    for cfg in (None, Fp8GemmConfig(64, 256, 2), Fp8GemmConfig(64, 128, 1, num_stages=6)):
        gemm_fp8.matmul(xq, xs, q, s, "block", config=cfg)
        gemm_fp8.matmul(
            xq, xs[:, 0], q, s[:, 0].repeat_interleave(128)[:192], "channel", config=cfg
        )
    # causal prefill attention at the 27B head shape, every config the GPU benchmark sweeps
    from specdash.kernels.triton.prefill_attention import CANDIDATES, causal_prefill_attention

    kv = torch.randn(4, 8, 256, dtype=bf)
    for cfg in CANDIDATES:
        causal_prefill_attention(torch.randn(3, 24, 256, dtype=bf), kv, kv, 5, 256**-0.5, cfg)


if __name__ == "__main__":
    sys.exit(main())
