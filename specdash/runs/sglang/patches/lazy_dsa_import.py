"""DSA attention's module imports without DeepGEMM, as SGLang 0.5.23's does.

Why: a draft-model worker (STANDALONE, EAGLE) decides whether it can capture its draft-extend
CUDA graph with `isinstance(backend, (..., DeepseekSparseAttnBackend, ...))`, and imports that
class from `layers.attention.dsa_backend` to ask. In SGLang 0.5.17 that module runs
`if is_cuda(): import deep_gemm` at import time, so on a CUDA box without DeepGEMM every
draft-model engine with CUDA graphs died in its capture with `No module named 'deep_gemm'`,
whatever its attention. 0.5.23's `dsa_backend` imports DeepGEMM where it is used; its
sibling `dsa.dsa_indexer` (0.5.17 too) keeps the ImportError as the module global.

The patch (0.5.17, only where `deep_gemm` is not installed): loads `dsa_backend` from its own
file with that one statement replaced by the sibling's guarded form. The module's every other
line runs as shipped; DSA code that calls DeepGEMM still fails, with the original error.
0.5.23 needs nothing; its variant records the module it relies on to import without it.
It is not an exactness patch: it is always applied, also where `--sglang-unpatch` turns the
others off ("stock"), so stock and patched engines start the same configurations.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from types import ModuleType

from specdash.runs.sglang.patches.registry import Patch, Target, Variant, edited_source

DSA_MODULE = "sglang.srt.layers.attention.dsa_backend"
_CAPTURE = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs"
UNGUARDED = "if is_cuda():\n    import deep_gemm\n"
GUARDED = (
    "if is_cuda():\n"
    "    try:\n"
    "        import deep_gemm\n"
    "    except ImportError as e:  # specdash lazy_dsa_import: DeepGEMM needed only when used\n"
    "        deep_gemm = e\n"
)


def deep_gemm_installed() -> bool:
    return importlib.util.find_spec("deep_gemm") is not None


def guarded_source(source: str) -> str:
    """`dsa_backend`'s source with its DeepGEMM import guarded; ValueError unless the
    unguarded statement occurs exactly once."""
    return edited_source(source, ((UNGUARDED, GUARDED),), "lazy_dsa_import: DeepGEMM import")


@dataclass
class ModuleFromGuardedSource:
    """Puts `dsa_backend`, executed from its guarded source, into `sys.modules` (and onto its
    package) before anything imports it; `remove` takes both out again."""

    _module: ModuleType | None = field(default=None, repr=False)

    @property
    def applied(self) -> bool:
        return self._module is not None

    def apply(self) -> None:
        if self.applied or deep_gemm_installed() or DSA_MODULE in sys.modules:
            return
        spec = importlib.util.find_spec(DSA_MODULE)
        assert spec is not None and spec.loader is not None and spec.origin is not None
        source = guarded_source(spec.loader.get_source(DSA_MODULE))  # type: ignore[attr-defined]
        module = importlib.util.module_from_spec(spec)
        sys.modules[DSA_MODULE] = module
        try:
            exec(compile(source, spec.origin, "exec"), module.__dict__)
        except BaseException:
            del sys.modules[DSA_MODULE]
            raise
        package, _, name = DSA_MODULE.rpartition(".")
        setattr(sys.modules[package], name, module)
        self._module = module

    def remove(self) -> None:
        if self._module is None:
            return
        package, _, name = DSA_MODULE.rpartition(".")
        if sys.modules.get(DSA_MODULE) is self._module:
            del sys.modules[DSA_MODULE]
        if getattr(sys.modules.get(package), name, None) is self._module:
            delattr(sys.modules[package], name)
        self._module = None


PATCH = Patch(
    name="lazy_dsa_import",
    flag="dsa-import",
    summary="DSA attention's module imports without DeepGEMM (draft-model CUDA graphs start)",
    always=True,
    variants={
        "0.5.17": Variant(
            targets=(
                Target(
                    DSA_MODULE, "9719d1f26bf952544eb51f365eccd3f850e624e81176a160ad51122034653b74"
                ),
                Target(
                    _CAPTURE,
                    "386e3b5ed33a38ee3a987d52c440d5ce5bd5382ac06602c88f7b0de6d45f678b",
                    role="relied on",
                ),
            ),
            rebindings=(ModuleFromGuardedSource(),),
        ),
        "0.5.23": Variant(
            targets=(
                Target(
                    DSA_MODULE,
                    "7c645f1247df04c611514843caa1733d383395f3122406e3da42f29b82b4bb41",
                    role="relied on",
                ),
                Target(
                    _CAPTURE,
                    "f91433b53c8ba4cd1c30430af24b84f8523a32d1ab08717e5f27de24f1b6312f",
                    role="relied on",
                ),
            ),
            rebindings=(),
        ),
    },
)
