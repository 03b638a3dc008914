"""The FP8 patch against the real sglang 0.5.17 and 0.5.23 wheels: `fp8_utils.fp8_scaled_mm`
and `fp8_utils.w8a8_block_fp8_matmul_triton` (the names every FP8 linear calls) are rebound to
routes that send decode, verify and draft forwards under `auto` to specdash's FP8 tile, and
everything else to SGLang's kernels made M-independent: per channel, the padded route reaches
sgl_kernel's AOT op with at least PAD_ROWS rows for any M, so a row's bits no longer depend on
its batch; the block-FP8 config lookup finds no tuned table at any M. `--sglang-unpatch fp8`
leaves all of it as shipped, the pinned FP8 switches included.

No GPU here: `sgl_kernel` is a CPU stand-in with the property that breaks exactness on the GPU,
an epilogue whose fp32 rounding order depends on M (CUTLASS's swap-AB configurations for
M <= 64: `ws * (xs * acc)` against `xs * (ws * acc)`), so the test fails if the route does not
pad."""

from __future__ import annotations

import json

from specdash.runs.sglang.patches import fp8_routing, patch_set

SCRIPT = """
import json, sys, types
import torch

def scaled_mm(a, b, sa, sb, out_dtype, bias=None):
    calls.append(a.shape[0])
    acc = a.float() @ b.float()
    sa, sb = sa.reshape(-1, 1).float(), sb.reshape(1, -1).float()
    out = sb * (sa * acc) if a.shape[0] <= 64 else sa * (sb * acc)  # swap-AB below 65 rows
    return out.to(out_dtype)

calls = []
import sglang.srt.layers.quantization.fp8_utils as fp8_utils
sys.modules["sgl_kernel"] = types.SimpleNamespace(fp8_scaled_mm=scaled_mm)  # after SGLang's imports
from specdash.runs.sglang.patches import fp8_routing, patch_set
from specdash.runs.sglang.patches.registry import resolve

fp8_utils.fp8_scaled_mm = scaled_mm  # what `if _is_cuda:` binds (0.5.23: the registry op)
block = resolve(fp8_routing.PATCH.variant().rebindings[1].owner_path)
torch.manual_seed(0)
k, n = 256, 64
w = torch.randn(k, n).to(torch.float8_e4m3fn)
x = torch.randn(200, k).to(torch.float8_e4m3fn)
xs, ws = torch.rand(200, 1) + 0.5, torch.rand(1, n) + 0.5

def row0_equal_to_alone(m):
    alone = fp8_utils.fp8_scaled_mm(x[:1], w, xs[:1], ws, torch.float32)
    batched = fp8_utils.fp8_scaled_mm(x[:m], w, xs[:m], ws, torch.float32)
    return batched.shape == (m, n) and torch.equal(batched[0], alone[0])

MS = (1, 8, 32, 64, 65, 128, 129, 200)
out = {"stock": [row0_equal_to_alone(m) for m in MS]}
calls.clear()
patch_set.by_flag("fp8").apply()
from specdash.runs.sglang.patches import gemm_routing
gemm_routing.prefill_forward = True  # SGLang's kernels: what a prefill runs
out["patched"] = [row0_equal_to_alone(m) for m in MS]
out["rows_sent"] = sorted(set(calls))
out["block_configs"] = block.get_w8a8_block_fp8_configs(14336, 5120, 128, 128)
out["block_kernel_sees_it"] = (
    block.w8a8_block_fp8_matmul_triton.__globals__["get_w8a8_block_fp8_configs"]
    is block.get_w8a8_block_fp8_configs
)
per_tensor = fp8_utils.fp8_scaled_mm(x[:3], w, xs[:1], ws, torch.float32)
out["per_tensor_scale"] = torch.equal(
    per_tensor, fp8_utils.fp8_scaled_mm(x[:3], w, xs[:1].expand(3, 1), ws, torch.float32)
)

# the split by forward: a stand-in tile (the real one needs CUDA) taken only by non-prefill
# forwards under `auto`; prefill and any other backend stay on SGLang's kernels
tile_calls = []
tile = types.SimpleNamespace(
    scaled_mm=lambda *a: tile_calls.append("channel") or "tile",
    block_matmul=lambda *a: tile_calls.append("block") or "tile",
)
fp8_routing._tile = lambda: tile
gemm_routing._runs_here = lambda backend: backend == fp8_routing.TILE
block.w8a8_block_fp8_matmul_triton = lambda *a, **kw: "sglang block"
xb, xbs = x[:2], torch.ones(2, k // 128)
wb, wbs = w.t().contiguous(), torch.ones(n // 128 + 1, k // 128)
routes = {}
CASES = (
    ("decode", False, "auto"),
    ("prefill", True, "auto"),
    ("decode sglang-triton", False, "sglang-triton"),
)
for label, prefill, backend in CASES:
    gemm_routing.set_backend(backend)
    gemm_routing.prefill_forward = prefill
    channel = fp8_utils.fp8_scaled_mm(x[:2], w, xs[:2], ws, torch.float32)
    blockwise = fp8_utils.w8a8_block_fp8_matmul_triton(xb, wb, xbs, wbs, [128, 128], torch.bfloat16)
    routes[label] = ["tile" if isinstance(channel, str) else "padded", blockwise]
gemm_routing.set_backend("auto")
gemm_routing.prefill_forward = False
routes["other block size"] = fp8_utils.w8a8_block_fp8_matmul_triton(xb, wb, xbs, wbs, [64, 64])
out["routes"], out["tile_calls"] = routes, tile_calls
patch_set.by_flag("fp8").remove()
out["removed"] = fp8_utils.fp8_scaled_mm is scaled_mm
out["env_read"] = [name in open(fp8_utils.__file__).read() for name in fp8_routing.PINNED_ENV]
print("RESULT " + json.dumps(out, default=str))
"""


def test_fp8_gemm_rows_do_not_depend_on_m_once_patched(run_each_sglang) -> None:
    proc = run_each_sglang(SCRIPT)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    # stock: a row alone (swap-AB) and in a batch of 65+ rows round differently: the test sees it
    assert r["stock"] == [True, True, True, True, False, False, False, False]
    assert r["patched"] == [True] * 8
    assert r["rows_sent"] == [fp8_routing.PAD_ROWS, 200]  # every smaller call padded
    assert r["block_configs"] is None and r["block_kernel_sees_it"]
    assert r["per_tensor_scale"]  # one scale for all rows broadcasts as SGLang's op does
    assert r["routes"] == {
        "decode": ["tile", "tile"],  # decode, verify and draft forwards under `auto`
        "prefill": ["padded", "sglang block"],
        "decode sglang-triton": ["padded", "sglang block"],  # a chosen backend is never overridden
        "other block size": "sglang block",  # the tile runs [128, 128] blocks only
    }
    assert r["tile_calls"] == ["channel", "block"]
    assert r["removed"]
    # USE_TRITON_W8A8_FP8_KERNEL is read by fp8_utils in both releases; the config-tune switch
    # only by 0.5.23's (0.5.17 does not know it: pinning it there changes nothing)
    assert r["env_read"] == [True, run_each_sglang.version == "0.5.23"]


def test_fp8_switches_are_pinned_only_with_the_patch_on(monkeypatch) -> None:
    from specdash.runs.sglang import process

    for name in fp8_routing.PINNED_ENV:
        monkeypatch.setenv(name, "1")
    names = [p.name for p in patch_set.all_patches()]
    with process.session_environment(names, None, None, pools_in_turn=False):
        import os

        assert {n: os.environ[n] for n in fp8_routing.PINNED_ENV} == fp8_routing.PINNED_ENV
    unpatched = [n for n in names if n != fp8_routing.PATCH.name]
    with process.session_environment(unpatched, None, None, pools_in_turn=False):
        assert all(os.environ[n] == "1" for n in fp8_routing.PINNED_ENV)
    assert patch_set.by_flag("fp8") is fp8_routing.PATCH
