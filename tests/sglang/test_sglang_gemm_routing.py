"""GEMM routing inside SGLang's deterministic mode, with the real `batch_invariant_ops` of each
release: its `aten::mm`/`addmm` overrides (registered here for the CPU key instead of CUDA),
the gemm patch applied, and the routed backend's own GEMM calling back into aten.

Routed through `F.linear`, the live switch to `specdash-cublas` fails: `F.linear` goes through
SGLang's `aten::addmm` override into `matmul_persistent`, i.e. back into the router, until
Python's recursion limit ('Capture cuda graph failed: maximum recursion depth exceeded')."""

from __future__ import annotations

import json

ROUTING_SCRIPT = """
import json
import torch
import torch.nn.functional as F
import sglang.srt.batch_invariant_ops.batch_invariant_ops as bio
from specdash.runs.sglang.patches import gemm_routing
from specdash.runs.sglang.patches.patch_set import by_flag

bio.get_dispatch_device_backend = lambda: "CPU"  # SGLang registers for the GPU's key
bio.enable_batch_invariant_mode()
patch = by_flag("gemm")
patch.apply()
gemm_routing._active = "specdash-cublas"  # set_backend refuses cuBLAS without CUDA
torch.manual_seed(0)
a = torch.randn(5, 32, dtype=torch.bfloat16)
w = torch.randn(48, 32, dtype=torch.bfloat16)

def run():
    try:
        out = F.linear(a, w)  # aten::addmm -> SGLang's override -> matmul_persistent -> router
    except RecursionError:
        return "RecursionError"
    rows = torch.cat([gemm_routing.cublas_unrouted(a[i : i + 1], w) for i in range(len(a))])
    return {"rows_equal": torch.equal(out, rows)}

result = {"routed": run()}
fixed = gemm_routing.cublas_unrouted
gemm_routing.cublas_unrouted = F.linear  # the route through SGLang's addmm override
result["through_f_linear"] = run()
gemm_routing.cublas_unrouted = fixed
patch.remove()
print("RESULT " + json.dumps(result))
"""


def test_cublas_route_does_not_reenter_sglang_overrides(run_each_sglang) -> None:
    proc = run_each_sglang(ROUTING_SCRIPT)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["through_f_linear"] == "RecursionError"  # the test can see the recursion
    assert r["routed"] == {"rows_equal": True}  # row by row: each verify row has decode's bits


SPLIT_SCRIPT = """
import inspect, json
from types import SimpleNamespace
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from specdash.kernels import gemm_backends
from specdash.runs.sglang.patches import gemm_routing

cpu_tile = lambda x, w: x.float() @ w.float().t() + 1.0
gemm_backends.register_backend("cpu-tile", cpu_tile)
gemm_routing.DECODE_BACKEND = "specdash-cpu-tile"  # the Triton tile needs CUDA
gemm_routing._runs_here.cache_clear()
a = torch.randn(3, 8, dtype=torch.bfloat16)
w = torch.randn(16, 8, dtype=torch.bfloat16)
b = w.t()
tile = torch.cat([cpu_tile(a[i : i + 1], w) for i in range(3)]).to(torch.bfloat16)
persistent = lambda a, b, bias=None: "sglang"
_matmul_persistent_triton = persistent  # what the `sglang-triton` route calls

def forward(input_ids, positions, forward_batch, pp_proxy_tensors=None):
    return gemm_routing.route(persistent, a, b)

marked = gemm_routing.marking_prefill(forward)
out = {"signature_kept": inspect.signature(marked) == inspect.signature(forward)}
MODES = ("EXTEND", "MIXED", "SPLIT_PREFILL", "DECODE", "TARGET_VERIFY", "DRAFT_EXTEND_V2", "IDLE")
for mode in MODES:
    got = marked(None, None, SimpleNamespace(forward_mode=ForwardMode[mode]))
    out[mode] = "sglang" if isinstance(got, str) else ("tile" if torch.equal(got, tile) else "?")
out["keyword"] = marked(None, None, forward_batch=SimpleNamespace(forward_mode=ForwardMode.DECODE))
out["keyword"] = "tile" if torch.equal(out["keyword"], tile) else "?"
out["after"] = gemm_routing.prefill_forward
gemm_routing.set_backend("sglang-triton")
out["sglang_triton_decode"] = marked(None, None, SimpleNamespace(forward_mode=ForwardMode.DECODE))
print("RESULT " + json.dumps(out, default=str))
"""


def test_auto_runs_prefill_on_sglang_and_every_other_forward_on_the_tile(run_each_sglang) -> None:
    """`auto` splits by the real ForwardMode of each release, never by M: prefill batches stay
    on SGLang's persistent kernel, decode, verify and draft forwards take the tile, so a verify
    row and the decode row it must equal share a kernel at any batch size."""
    proc = run_each_sglang(SPLIT_SCRIPT)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["signature_kept"]  # SGLang inspects model.forward for pp_proxy_tensors
    assert [r[m] for m in ("EXTEND", "MIXED", "SPLIT_PREFILL")] == ["sglang"] * 3
    assert [r[m] for m in ("DECODE", "TARGET_VERIFY", "DRAFT_EXTEND_V2", "IDLE")] == ["tile"] * 4
    assert r["keyword"] == "tile" and r["after"] is False
    assert r["sglang_triton_decode"] == "sglang"  # a chosen backend is never overridden
