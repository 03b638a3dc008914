"""specdash/runs/sglang/patches/diffs/<release>/*.diff against the real sglang 0.5.17 and 0.5.23
files: each applies cleanly with `patch -p1`, and the patched-on-disk modules behave like that
release's runtime patches (same launch configs, same packed-decode flag, same conv update kernel
source, same verify routing, same GEMM routing, the same FP8 block-config lookup; on 0.5.17 the
same DFLASH worker source and request check)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from specdash.runs.sglang.patches import patch_set, registry

DIFFS = Path(registry.__file__).parent / "diffs"
EXACTNESS_PATCHES = (
    "gdn_verify_as_decode",
    "verify_attention_as_decode_rows",
    "gemm_routing",
    "fp8_routing",
)
DIFFED = {
    "0.5.17": (*EXACTNESS_PATCHES, "dflash_logprobs"),
    "0.5.23": EXACTNESS_PATCHES,
}
"""The patches shipped as diffs per release: the exactness patches, and 0.5.17's DFLASH
logprob port (0.5.23 needs none)."""


def diff_files(diff: Path) -> list[str]:
    return [ln[6:].strip() for ln in diff.read_text().splitlines() if ln.startswith("+++ b/")]


@pytest.fixture(scope="module")
def patched_tree(run_each_sglang, tmp_path_factory) -> Path:
    """Copies of the files this release's diffs touch, patched with `patch -p1`."""
    if shutil.which("patch") is None:
        pytest.fail("GNU patch is needed to test the patches' diffs (apt-get install patch)")
    wheel = run_each_sglang.wheel
    tree = tmp_path_factory.mktemp("patched")
    for name in DIFFED[run_each_sglang.version]:
        diff = DIFFS / run_each_sglang.version / f"{name}.diff"
        for rel in diff_files(diff):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(wheel / rel, tree / rel)
        for dry in (["--dry-run"], []):
            proc = subprocess.run(
                ["patch", "-p1", "--forward", *dry, "-d", str(tree), "-i", str(diff)],
                capture_output=True,
                text=True,
            )
            assert proc.returncode == 0, f"{diff.name} does not apply:\n{proc.stdout}"
    return tree


@pytest.mark.parametrize("row", registry.SUPPORTED_VERSIONS)
def test_each_diffed_patch_has_a_diff_on_its_replaced_targets(row: str) -> None:
    patches = {p.name: p for p in patch_set.all_patches()}
    assert sorted(f.stem for f in (DIFFS / row).glob("*.diff")) == sorted(DIFFED[row])
    for name in DIFFED[row]:
        diff = DIFFS / row / f"{name}.diff"
        touched = {f.removesuffix(".py").replace("/", ".") for f in diff_files(diff)}
        targets = patches[name].variant(row).targets
        replaced = [t.path for t in targets if t.role == "replaced"]
        assert all(any(path.startswith(m + ".") for m in touched) for path in replaced), name


EQUIVALENCE_SCRIPT = """
import importlib.util, inspect, json, os, sys
from types import SimpleNamespace
import sglang
import torch

from specdash.runs.sglang.patches import patch_set, verify_attention_as_decode_rows as rows_mod
from specdash.runs.sglang.patches import gemm_routing
from specdash.kernels import gemm_backends as kernels

tree = os.environ["PATCHED_TREE"]

def load(rel):
    name = "ondisk_" + rel.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, f"{tree}/{rel}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod

out = {}
NEW = sglang.__version__ == "0.5.23"
gdn_disk = load("sglang/srt/layers/attention/linear/kernels/gdn_triton.py")
if NEW:  # 0.5.17 has no GDN launch config to pin
    launch_disk = load("sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py")
hybrid_disk = load("sglang/srt/layers/attention/hybrid_linear_attn_backend.py")
ops_disk = load("sglang/srt/batch_invariant_ops/batch_invariant_ops.py")
conv_disk = load("sglang/kernels/ops/mamba/causal_conv1d_triton.py")
from sglang.kernels.ops.mamba import causal_conv1d_triton as conv_rt

def kernel_source(kernel):
    return inspect.getsource(kernel.fn)

conv_stock = kernel_source(conv_rt._causal_conv1d_update_kernel)
patch_set.apply_all()
# the conv update kernel: the diff's text is the runtime patch's, character for character
conv_patched = kernel_source(conv_rt._causal_conv1d_update_kernel)
out["conv_kernel"] = [kernel_source(conv_disk._causal_conv1d_update_kernel) == conv_patched,
                      conv_patched != conv_stock, "acc += tap0 * w_col3" in conv_patched]
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
from sglang.srt.batch_invariant_ops import batch_invariant_ops as ops_rt

out["packed"] = [gdn_disk.TritonGDNKernel.supports_packed_decode,
                 TritonGDNKernel.supports_packed_decode]

grid = [(n, h, hv, k, v, kda, tv) for n in (1, 8, 80) for (h, hv) in ((4, 16), (8, 8))
        for (k, v) in ((128, 128), (64, 64)) for kda in (False, True) for tv in (False, True)]
configs = []
if NEW:
    from sglang.kernels.ops.attention.linear import fused_sigmoid_gating_recurrent as launch_rt

    for sm90 in (False, True):
        launch_disk._is_sm90 = launch_rt._is_sm90 = sm90
        for n, h, hv, k, v, kda, tv in grid:
            configs.append([list(mod._select_recurrent_launch_config(n, h, hv, k, v, kda,
                                                                      target_verify=tv))
                            for mod in (launch_disk, launch_rt)])
out["launch_pairs"] = configs

calls = []
rows_mod.verify_as_decode_rows = lambda *a, **kw: calls.append((a[0], a[2:6], kw)) or "rows"
verify = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True))
hybrid = SimpleNamespace(_is_full_attn=lambda layer, layer_id: True)
out["verify_routing"] = [
    cls.forward_extend(hybrid, "L", verify, True, "q", "k", "v", layer_id=3)
    for cls in (hybrid_disk.HybridLinearAttnBackend, HybridLinearAttnBackend)
]
kernels_row = rows_mod.ROW_KERNELS[sglang.__version__]
out["verify_calls_equal"] = (
    calls[0] == calls[1] == (kernels_row, ("L", verify, True, "q"), {"layer_id": 3})
)

kernels.register_backend("cpu-test", lambda x, w: x.float() @ w.float().t() + 1.0)
gemm_routing.set_backend("cpu-test")
a = torch.randn(3, 8, dtype=torch.bfloat16)
b = torch.randn(16, 8, dtype=torch.bfloat16).t()
expected = (a.float() @ b.float() + 1.0).to(torch.bfloat16)
out["gemm"] = [torch.equal(mod.matmul_persistent(a, b), expected) for mod in (ops_disk, ops_rt)]

if not NEW:  # the DFLASH logprob port: the worker's source and the request check
    from types import SimpleNamespace

    import textwrap
    from sglang.srt.managers import scheduler as scheduler_rt
    from sglang.srt.speculative import dflash_utils as utils_rt, dflash_worker_v2 as worker_rt

    utils_disk = load("sglang/srt/speculative/dflash_utils.py")
    worker_disk = load("sglang/srt/speculative/dflash_worker_v2.py")
    method = lambda mod: textwrap.dedent(inspect.getsource(
        mod.DFlashWorkerV2.forward_batch_generation))
    out["dflash_worker"] = [method(worker_disk) == method(worker_rt),
                            "chain_logprobs(" in method(worker_rt)]
    reqs = [SimpleNamespace(return_logprob=lp, return_hidden_states=hs)
            for lp in (False, True) for hs in (False, True)]
    out["dflash_validate"] = [
        [f(r, overlap) for r in reqs for overlap in (False, True)]
        for f in (utils_disk.validate_dflash_request, utils_rt.validate_dflash_request,
                  scheduler_rt.validate_dflash_request)
    ]
print("RESULT " + json.dumps(out))
"""


def test_patched_files_behave_like_the_runtime_patches(run_each_sglang, patched_tree: Path) -> None:
    proc = run_each_sglang(EQUIVALENCE_SCRIPT, env={"PATCHED_TREE": str(patched_tree)})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["packed"] == [False, False]
    assert r["conv_kernel"] == [True, True, True]
    assert all(disk == runtime for disk, runtime in r["launch_pairs"]), r["launch_pairs"]
    if run_each_sglang.version == "0.5.23":
        assert [32, 1] in [disk for disk, _ in r["launch_pairs"]]
    else:
        assert r["launch_pairs"] == []
    assert r["verify_routing"] == ["rows", "rows"] and r["verify_calls_equal"]
    assert r["gemm"] == [True, True]
    if run_each_sglang.version == "0.5.17":
        assert r["dflash_worker"] == [True, True]
        disk, *runtime = r["dflash_validate"]
        # 8 cases; refused only: hidden states with overlap (2)
        assert runtime == [disk, disk] and disk.count(None) == 6, disk


FP8_SCRIPT = """
import importlib.util, os, sys
import sglang
from specdash.runs.sglang.patches import fp8_routing, patch_set, registry

tree = os.environ["PATCHED_TREE"]
kernel = fp8_routing.PATCH.variant().rebindings[1].owner_path
spec = importlib.util.spec_from_file_location(
    "ondisk_fp8_kernel", f"{tree}/{kernel.replace('.', '/')}.py"
)
disk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(disk)
patch_set.apply_all()
runtime = registry.resolve(kernel)
shapes = [(14336, 5120), (34816, 5120)]  # the 27B qkv and gate_up
print("BLOCK", [[m.get_w8a8_block_fp8_configs(n, k, 128, 128) for n, k in shapes]
                for m in (disk, runtime)])
utils = open(f"{tree}/sglang/srt/layers/quantization/fp8_utils.py").read()
print("ALIAS", "from specdash.runs.sglang.patches.fp8_routing import (" in utils
      and "routed_scaled_mm as fp8_scaled_mm," in utils
      and "routed_block_matmul as w8a8_block_fp8_matmul_triton," in utils)
"""


def test_fp8_diff_does_what_the_runtime_patch_does(run_each_sglang, patched_tree: Path) -> None:
    """The block-FP8 config lookup finds no table on disk as at runtime; the per-channel and the
    block GEMM names are bound to the same routes (the per-channel one on CUDA: here the
    `if _is_cuda:` block that binds it does not run, so its text is read)."""
    proc = run_each_sglang(FP8_SCRIPT, env={"PATCHED_TREE": str(patched_tree)})
    lines = dict(
        ln.split(" ", 1) for ln in proc.stdout.splitlines() if ln[:5] in ("BLOCK", "ALIAS")
    )
    assert lines["BLOCK"] == str([[None, None]] * 2)
    assert lines["ALIAS"] == "True"
