"""The CPU's exact GEMM and GDN recurrence: a few lines of C whose rows cannot depend on how
many come together.

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
GEMM falls back to one BLAS call per row (`gemm_backends`), exact too, only slower; so it does
with ``SPECDASH_CPU_GEMM=0`` (the path before this library, for comparisons).
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

/* The gated delta rule, token after token (ops.gdn_recurrent_steps): q, k [t, hv, dk],
   v [t, hv, dv], decay, beta [t, hv], state [hv, dk, dv]; out [t, hv, dv] and steps
   [t, hv, dk, dv] (the state after each token). A token's arithmetic is the same loop
   whatever t: verify's steps are decode's. Sums over dk run in i order. */
void specdash_gdn_steps(cf *q, cf *k, cf *v, cf *decay, cf *beta, cf *state, float *out,
                        float *steps, long t_len, long hv, long dk, long dv) {
    float mem[dv];
    for (long t = 0; t < t_len; t++) {
        cf *prev = t == 0 ? state : steps + (t - 1) * hv * dk * dv;
        for (long hh = 0; hh < hv; hh++) {
            const long th = t * hv + hh;
            const float d = decay[th], b = beta[th];
            cf *hp = prev + hh * dk * dv, *qh = q + th * dk, *kh = k + th * dk;
            cf *vh = v + th * dv;
            float *h = steps + th * dk * dv, *o = out + th * dv;
            for (long j = 0; j < dv; j++) mem[j] = 0.0f;
            for (long i = 0; i < dk; i++)
                for (long j = 0; j < dv; j++) {
                    h[i * dv + j] = hp[i * dv + j] * d;
                    mem[j] = mem[j] + h[i * dv + j] * kh[i];
                }
            for (long j = 0; j < dv; j++) mem[j] = (vh[j] - mem[j]) * b;
            for (long j = 0; j < dv; j++) o[j] = 0.0f;
            for (long i = 0; i < dk; i++)
                for (long j = 0; j < dv; j++) {
                    h[i * dv + j] = h[i * dv + j] + kh[i] * mem[j];
                    o[j] = o[j] + h[i * dv + j] * qh[i];
                }
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


def compile_library(name: str, source: str, flags: list[str]) -> ctypes.CDLL:
    """`source` built with the system C compiler into the user cache directory (once per
    source, flags and CPU) and loaded; OSError says why not."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (cc/gcc) on PATH")
    if platform.machine() in ("x86_64", "AMD64"):
        flags = [*flags, "-march=native"]
    key = hashlib.sha256(f"{source}\n{flags}\n{_cpu_key()}".encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdash"
    lib = base / f"{name}-{key}.so"
    if not lib.exists():
        base.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            src = Path(tmp) / f"{name}.c"
            src.write_text(source)
            out = Path(tmp) / f"{name}.so"
            run = subprocess.run(
                [cc, *flags, str(src), "-o", str(out), "-lm"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if run.returncode != 0:
                raise OSError(f"{cc} failed: {run.stderr.strip()[:300]}")
            os.replace(out, lib)
    return ctypes.CDLL(str(lib))


def _build() -> ctypes.CDLL:
    dll = compile_library("cpu_gemm", SOURCE, FLAGS)
    fn = dll.specdash_gemm_rows
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3
    fn.restype = None
    gdn = dll.specdash_gdn_steps
    gdn.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_long] * 4
    gdn.restype = None
    return dll


def load() -> ctypes.CDLL | None:
    """The compiled library, built on the first call; None (and `unavailable` says why) when
    it cannot be built or loaded. Decided once per process, never per call."""
    global _lib, unavailable
    if _lib is None and unavailable is None:
        if os.environ.get("SPECDASH_CPU_GEMM") == "0":
            unavailable = "SPECDASH_CPU_GEMM=0"
            return None
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


def gdn_steps(
    q: Tensor, k: Tensor, v: Tensor, decay: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """`ops.gdn_recurrent_steps` (all fp32) through the compiled loop: (o, steps)."""
    lib = _lib
    assert lib is not None
    q, k, v, decay, beta, state = (x.contiguous() for x in (q, k, v, decay, beta, state))
    t, hv, dk = q.shape
    dv = v.shape[-1]
    out = torch.empty((t, hv, dv), dtype=torch.float32)
    steps = torch.empty((t, hv, dk, dv), dtype=torch.float32)
    ptrs = (x.data_ptr() for x in (q, k, v, decay, beta, state, out, steps))
    lib.specdash_gdn_steps(*ptrs, t, hv, dk, dv)
    return out, steps
