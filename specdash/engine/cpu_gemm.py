"""The CPU's exact GEMM: a few lines of C whose rows cannot depend on how many come together.

`out[m, n] = sum_k x[m, k] * w[k, n]` with every output element one chain of fp32
multiply-then-add in k order, starting from +0. Built with ``-ffp-contract=off`` and without
``-ffast-math``, the compiler may not fuse, reorder or re-associate those operations; it only
vectorises across n (independent outputs, one lane each) and reuses a weight block across the
rows of a call. Which row a token is, how many rows come with it and what they hold change the
loop trip counts, never an element's arithmetic: a verify row is bit for bit the decode row of
its position by construction, on every CPU the library is built on. BLAS gives no such
promise (MKL rounds a row differently by its slot in the micro-kernel: measured under AVX2).

The library is compiled on first use with the system C compiler (about a second) into the user
cache directory, keyed by the source, the flags and the CPU; where no compiler works the exact
GEMM falls back to one BLAS call per row (`gemm_backends`), exact too, only slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

Tensor = torch.Tensor

SOURCE = r"""
#define NB 64 /* outputs per block: the vector lanes */
#define MR 4  /* rows per tile: they share each weight load */
typedef const float cf;

/* MR rows: acc[r][j] = ((0 + x[r,0]*w[0,j]) + x[r,1]*w[1,j]) + ..., the chain of `one` */
static inline void tile(cf *x, cf *w, float *out, long k_dim, long n_dim, long n0) {
    float acc[MR][NB];
    for (long r = 0; r < MR; r++)
        for (long j = 0; j < NB; j++) acc[r][j] = 0.0f;
    for (long k = 0; k < k_dim; k++) {
        cf *wk = w + k * n_dim + n0;
        for (long r = 0; r < MR; r++) {
            const float xv = x[r * k_dim + k];
            for (long j = 0; j < NB; j++) acc[r][j] = acc[r][j] + xv * wk[j];
        }
    }
    for (long r = 0; r < MR; r++)
        for (long j = 0; j < NB; j++) out[r * n_dim + n0 + j] = acc[r][j];
}

/* one row, nb <= NB outputs */
static inline void one(cf *xm, cf *w, float *om, long k_dim, long n_dim, long n0, long nb) {
    float acc[NB];
    for (long j = 0; j < nb; j++) acc[j] = 0.0f;
    for (long k = 0; k < k_dim; k++) {
        const float xv = xm[k];
        cf *wk = w + k * n_dim + n0;
        for (long j = 0; j < nb; j++) acc[j] = acc[j] + xv * wk[j];
    }
    for (long j = 0; j < nb; j++) om[n0 + j] = acc[j];
}

/* `one` with the full block width known to the compiler */
static inline void one_full(cf *xm, cf *w, float *om, long k_dim, long n_dim, long n0) {
    float acc[NB];
    for (long j = 0; j < NB; j++) acc[j] = 0.0f;
    for (long k = 0; k < k_dim; k++) {
        const float xv = xm[k];
        cf *wk = w + k * n_dim + n0;
        for (long j = 0; j < NB; j++) acc[j] = acc[j] + xv * wk[j];
    }
    for (long j = 0; j < NB; j++) om[n0 + j] = acc[j];
}

/* x [m, k] row-major, w [k, n] row-major, out [m, n] */
void specdash_gemm_rows(cf *x, cf *w, float *out, long m_rows, long k_dim, long n_dim) {
    for (long n0 = 0; n0 < n_dim; n0 += NB) {
        long nb = n_dim - n0 < NB ? n_dim - n0 : NB, m = 0;
        if (nb == NB)
            for (; m + MR <= m_rows; m += MR)
                tile(x + m * k_dim, w, out + m * n_dim, k_dim, n_dim, n0);
        for (; m < m_rows; m++) {
            if (nb == NB)
                one_full(x + m * k_dim, w, out + m * n_dim, k_dim, n_dim, n0);
            else
                one(x + m * k_dim, w, out + m * n_dim, k_dim, n_dim, n0, nb);
        }
    }
}
"""
FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
_lib: ctypes.CDLL | None = None
unavailable: str | None = None
"""Why the compiled GEMM cannot be had here (None: not tried yet, or it loaded)."""


def _cpu_key() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in info.splitlines() if ln.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {platform.processor()} {flags}"


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (cc/gcc) on PATH")
    flags = [*FLAGS, "-march=native"] if platform.machine() in ("x86_64", "AMD64") else FLAGS
    key = hashlib.sha256(f"{SOURCE}\n{flags}\n{_cpu_key()}".encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdash"
    lib = base / f"cpu_gemm-{key}.so"
    if not lib.exists():
        base.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            src = Path(tmp) / "cpu_gemm.c"
            src.write_text(SOURCE)
            out = Path(tmp) / "cpu_gemm.so"
            run = subprocess.run(
                [cc, *flags, str(src), "-o", str(out)], capture_output=True, text=True, timeout=120
            )
            if run.returncode != 0:
                raise OSError(f"{cc} failed: {run.stderr.strip()[:300]}")
            os.replace(out, lib)
    dll = ctypes.CDLL(str(lib))
    fn = dll.specdash_gemm_rows
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3
    fn.restype = None
    return dll


def load() -> ctypes.CDLL | None:
    """The compiled library, built on the first call; None (and `unavailable` says why) when
    it cannot be built or loaded. Decided once per process, never per call."""
    global _lib, unavailable
    if _lib is None and unavailable is None:
        try:
            _lib = _build()
        except (OSError, subprocess.SubprocessError) as exc:
            unavailable = f"{type(exc).__name__}: {exc}"
    return _lib


def gemm_rows(x: Tensor, wt: Tensor) -> Tensor:
    """`x [M, K] @ wt [K, N]` (fp32, wt contiguous) through the compiled loop."""
    lib = _lib
    assert lib is not None
    x = x.contiguous()
    m, k = x.shape
    n = wt.shape[1]
    out = torch.empty((m, n), dtype=torch.float32)
    lib.specdash_gemm_rows(x.data_ptr(), wt.data_ptr(), out.data_ptr(), m, k, n)
    return out
