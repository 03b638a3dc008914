"""lazy_dsa_import against the real 0.5.17 and 0.5.23 wheels (CPU): the 0.5.17 module is loaded
from its own file with exactly its DeepGEMM import guarded, before anything imports it, and the
draft worker's lazy `from ... import DeepseekSparseAttnBackend` gets that module; removing it
leaves `sys.modules` as found. 0.5.23 has nothing to guard. On a CPU `is_cuda()` is False, so
the guarded branch itself is exercised by the statement alone; a GPU run (STANDALONE with
CUDA graphs, `test_sglang_gpu`) is where the import it avoids fails without it."""

from __future__ import annotations

import pytest

from specdash.runs.sglang.patches import lazy_dsa_import

APPLY_SCRIPT = """
import sys
from specdash.runs.sglang.patches import lazy_dsa_import as l, registry
DSA = l.DSA_MODULE
assert DSA not in sys.modules
assert not l.deep_gemm_installed()
l.PATCH.apply()
(change,) = l.PATCH.variant().rebindings
module = sys.modules[DSA]
assert change.applied and module is change._module
from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend
assert DeepseekSparseAttnBackend is module.DeepseekSparseAttnBackend
import sglang.srt.speculative.eagle_worker_v2  # the capture's module imports as before
assert sys.modules[DSA] is module
l.PATCH.remove()
assert DSA not in sys.modules and not change.applied
assert not hasattr(sys.modules["sglang.srt.layers.attention"], "dsa_backend")
l.PATCH.apply()  # re-apply builds it again
assert sys.modules[DSA] is not module and change.applied
print("APPLIED-OK")
"""


def test_0_5_17_module_loads_from_guarded_source_and_removes_cleanly(run_each_sglang) -> None:
    if run_each_sglang.version != "0.5.17":
        assert lazy_dsa_import.PATCH.variant("0.5.23").rebindings == ()
        source = (run_each_sglang.wheel / "sglang/srt/layers/attention/dsa_backend.py").read_text()
        assert "import deep_gemm" not in source  # 0.5.23 imports it where it is used
        with pytest.raises(ValueError, match="found 0x"):
            lazy_dsa_import.guarded_source(source)
        return
    assert "APPLIED-OK" in run_each_sglang(APPLY_SCRIPT).stdout


def test_guarded_source_changes_exactly_the_deep_gemm_import(run_each_sglang) -> None:
    if run_each_sglang.version != "0.5.17":
        pytest.skip("0.5.23 has no module-level DeepGEMM import (the other case above)")
    source = (run_each_sglang.wheel / "sglang/srt/layers/attention/dsa_backend.py").read_text()
    guarded = lazy_dsa_import.guarded_source(source)
    compile(guarded, "dsa_backend.py", "exec")
    assert guarded.replace(lazy_dsa_import.GUARDED, lazy_dsa_import.UNGUARDED) == source
    with pytest.raises(ValueError, match="found 2x"):
        lazy_dsa_import.guarded_source(source + lazy_dsa_import.UNGUARDED)


def test_guarded_statement_keeps_the_import_error_on_cuda_without_deep_gemm() -> None:
    assert not lazy_dsa_import.deep_gemm_installed()
    on_cuda = {"is_cuda": lambda: True}
    with pytest.raises(ModuleNotFoundError, match="deep_gemm"):
        exec(lazy_dsa_import.UNGUARDED, dict(on_cuda))
    namespace = dict(on_cuda)
    exec(lazy_dsa_import.GUARDED, namespace)
    assert isinstance(namespace["deep_gemm"], ModuleNotFoundError)
