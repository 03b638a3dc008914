"""Does an FP8 GEMM row's output depend on how many rows the call has? On a GPU with sgl_kernel.

For each weight shape (N, K) and each M, row 0 of the call with M rows is compared, bit for bit,
with the same row computed alone (M = 1), for three kernels: sgl_kernel's CUTLASS
`fp8_scaled_mm` as SGLang calls it (stock), the same op through specdash's
`fp8_routing.padded_scaled_mm` (at least PAD_ROWS rows), and SGLang's block-FP8 Triton GEMM
(`w8a8_block_fp8_matmul_triton`, [128, 128] scales, with the fp8_routing pin of its config
lookup). Also the microseconds per call and the weight's GB/s at small M, stock beside padded.

Usage: python benchmarks/fp8_rows_check.py [--json OUT] [--shapes N:K,...] [--ms 1,8,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

SHAPES = "14336:5120,96:5120,5120:6144,34816:5120,5120:17408,6144:2048,2048:6144"
"""The 27B shape's FP8 GEMMs (qkv, in_proj_ba, o/out_proj, gate_up, down) and two small ones."""
MS = "1,2,4,8,16,17,32,33,64,65,96,128,129,256,1024"
FP8 = torch.float8_e4m3fn


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
    return (x.float() / scale).clamp(-448, 448).to(FP8), scale


def timed(fn, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


KINDS = ("stock", "padded", "block")


def check_shape(n: int, k: int, ms: list[int], stock_mm, padded_mm, block) -> dict:
    """Row 0 at each M against M = 1 for the three kernels, and their times at M = 1, 8, 32."""
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    wq, ws = quant_rows(w)  # per output channel, as online FP8 quantizes
    b, bs = wq.t(), ws.reshape(1, n).contiguous()
    x = torch.randn(max(ms), k, device="cuda", dtype=torch.bfloat16)
    xq, xs = quant_rows(x)
    calls = {
        "stock": lambda m: stock_mm(xq[:m], b, xs[:m], bs, torch.bfloat16, None),
        "padded": lambda m: padded_mm(xq[:m], b, xs[:m], bs, torch.bfloat16, None),
    }
    if n % 128 == 0 and k % 128 == 0:
        nb, kb = n // 128, k // 128
        wblk = w.float().view(nb, 128, kb, 128)
        bscale = wblk.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
        bq = (wblk / bscale[:, None, :, None]).to(FP8).view(n, k)
        xg = x.float().view(max(ms), kb, 128)
        ascale = xg.abs().amax(dim=2).clamp(min=1e-12) / 448.0
        aq = (xg / ascale[:, :, None]).to(FP8).view(max(ms), k)
        calls["block"] = lambda m: block.w8a8_block_fp8_matmul_triton(
            aq[:m].contiguous(), bq, ascale[:m].contiguous(), bscale, [128, 128], torch.bfloat16
        )
    row: dict = {kind: {} for kind in KINDS}
    for kind, call in calls.items():
        alone = call(1)[0]
        row[kind] = {m: bool(torch.equal(call(m)[0], alone)) for m in ms}
        for m in (1, 8, 32):
            us = timed(lambda c=call, m=m: c(m))
            row.setdefault(f"us_M{m}", {})[kind] = round(us, 2)
            row.setdefault(f"GBps_M{m}", {})[kind] = round(n * k / us / 1e3, 1)
    row["padded_vs_stock_at_M129"] = bool(torch.equal(calls["padded"](129), calls["stock"](129)))
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", type=Path)
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--ms", default=MS)
    args = p.parse_args()
    import sgl_kernel

    from specdash.runs.sglang.patches import fp8_routing

    try:
        from sglang.kernels.ops.quantization import fp8_kernel as block
    except ImportError:
        from sglang.kernels.ops.gemm import fp8_kernel as block
    block.get_w8a8_block_fp8_configs = fp8_routing.default_block_configs(None)
    torch.manual_seed(0)
    ms = [int(m) for m in args.ms.split(",")]
    out: dict = {"device": torch.cuda.get_device_name(), "shapes": {}}
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split(":"))
        row = check_shape(n, k, ms, sgl_kernel.fp8_scaled_mm, fp8_routing.padded_scaled_mm, block)
        out["shapes"][shape] = row
        bad = {kind: [m for m, ok in row[kind].items() if not ok] for kind in KINDS}
        print(f"{shape}: row 0 differs from M=1 at M = {bad}; us at M=1 {row['us_M1']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    sys.exit(0)


if __name__ == "__main__":
    main()
