"""GEMM routing inside SGLang's deterministic mode, with the real `batch_invariant_ops` of each
release: its `aten::mm`/`addmm` overrides (registered here for the CPU key instead of CUDA),
the gemm patch applied, and the routed backend's own GEMM calling back into aten.

On the H200 the live switch to `specdash-cublas` failed: its `F.linear` went through SGLang's
`aten::addmm` override into `matmul_persistent`, i.e. back into the router, until Python's
recursion limit ('Capture cuda graph failed: maximum recursion depth exceeded')."""

from __future__ import annotations

import json

ROUTING_SCRIPT = """
import json
import torch
import torch.nn.functional as F
import sglang.srt.batch_invariant_ops.batch_invariant_ops as bio
from specdash.engine_patches import gemm_routing
from specdash.engine_patches.patch_set import by_flag

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
gemm_routing.cublas_unrouted = F.linear  # what the router called before
result["through_f_linear"] = run()
gemm_routing.cublas_unrouted = fixed
patch.remove()
print("RESULT " + json.dumps(result))
"""


def test_cublas_route_does_not_reenter_sglang_overrides(run_each_sglang) -> None:
    proc = run_each_sglang(ROUTING_SCRIPT)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["through_f_linear"] == "RecursionError"  # the H200 failure, reproduced
    assert r["routed"] == {"rows_equal": True}  # row by row: each verify row has decode's bits
