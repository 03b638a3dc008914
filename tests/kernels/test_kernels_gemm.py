"""Batch-invariant GEMM: fp64 reference, rows bit-identical across M and batch composition.

On CPU the kernels run in Triton's interpreter (specdash.kernels selects it); the GPU tests run the
same checks on Qwen3.5-27B shapes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from specdash.errors import EnvironmentProblem
from specdash.kernels import gemm_backends
from specdash.kernels.triton import gemm, tickets
from specdash.kernels.triton.elementwise import swiglu_rows
from specdash.kernels.triton.gemm import GemmConfig, gemm_config, matmul_batch_invariant

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_CONFIGS = [
    None,
    GemmConfig(32, 64, 2),
    GemmConfig(16, 32, 4, num_stages=2),
    GemmConfig(32, 64, 4, tma=True),
]


def _rel_err(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    ref = x.double() @ w.double().T
    return ((out.double() - ref).norm() / ref.norm()).item()


def assert_rows_invariant(fn, x: torch.Tensor, w: torch.Tensor) -> None:
    """Every row of the 16-row launch equals: each prefix M, the row alone, any row order."""
    full = fn(x, w)
    for m in range(1, x.shape[0] + 1):
        assert torch.equal(fn(x[:m], w), full[:m]), f"M={m}"
    for i in range(x.shape[0]):
        assert torch.equal(fn(x[i : i + 1], w), full[i : i + 1]), f"row {i} alone"
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1)).to(x.device)
    assert torch.equal(fn(x[perm], w), full[perm])
    assert torch.equal(fn(x[3:11], w), full[3:11])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("config", CPU_CONFIGS)
def test_matches_fp64_and_rows_are_batch_invariant(dtype, config):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 256, generator=g).to(dtype)
    x = torch.randn(16, 256, generator=g).to(dtype)
    fn = lambda a, b: matmul_batch_invariant(a, b, config=config)  # noqa: E731
    out = fn(x, w)
    assert out.dtype == dtype and out.shape == (16, 48)
    assert _rel_err(out, x, w) < (5e-3 if dtype == torch.bfloat16 else 1e-6)
    assert_rows_invariant(fn, x, w)


def test_split_k_changes_bits_only_with_the_config_not_with_m():
    """The split is part of the (N, K) config: two splits may differ, but each is M-invariant."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(32, 512, generator=g)
    x = torch.randn(5, 512, generator=g)
    for split in (1, 2, 4):
        cfg = GemmConfig(32, 64, split)
        full = matmul_batch_invariant(x, w, config=cfg)
        assert torch.equal(matmul_batch_invariant(x[2:3], w, config=cfg), full[2:3])
    # the per-tile tickets are left at zero, ready for the next launch or graph replay
    assert not tickets.counters("gemm", x.device, 1).any()


def test_config_depends_on_weight_shape_only():
    assert gemm_config(5120, 17408, torch.bfloat16) == gemm_config(5120, 17408, torch.bfloat16)
    cfg = gemm_config(5120, 17408, torch.bfloat16)
    assert 17408 % (cfg.split_k * cfg.block_k) == 0


def test_leading_dims_like_f_linear():
    x = torch.randn(2, 3, 64)
    w = torch.randn(16, 64)
    out = matmul_batch_invariant(x, w)
    assert out.shape == (2, 3, 16)
    assert torch.equal(out[1, 2], matmul_batch_invariant(x[1, 2:3], w)[0])


def test_unsupported_dtype_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(gemm, "_warned", set())
    x = torch.randn(2, 32, dtype=torch.float64)
    w = torch.randn(8, 32, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="float64 not supported"):
        out = matmul_batch_invariant(x, w)
    assert torch.equal(out, F.linear(x, w))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        matmul_batch_invariant(x, w)  # second time: no warning


def test_mixed_dtypes_raise_like_f_linear():
    with pytest.raises(RuntimeError, match="dtype"):
        matmul_batch_invariant(torch.randn(2, 32), torch.randn(8, 32, dtype=torch.bfloat16))


def test_backend_table_lists_reasons_and_refuses_unavailable(monkeypatch):
    monkeypatch.setattr(gemm_backends, "_gpu_backends", {})
    backends = gemm_backends.available_backends()
    assert backends["triton"] is None
    assert gemm_backends.get_backend("triton") is matmul_batch_invariant
    # SGLang's routes: no fused one
    assert list(backends) == ["cublas", "triton", "triton-fp8", "deepgemm"]
    assert list(gemm_backends.gpu_backends()) == [
        "cublas", "triton", "triton-fused", "triton-fp8", "deepgemm"
    ]  # fmt: skip
    assert [b.batch_invariant for b in gemm_backends.gpu_backends().values()] == [
        False,
        True,
        True,
        True,
        False,
    ]
    assert gemm_backends.get_fp8_backend("triton-fp8").block_matmul.__name__ == (
        "w8a8_block_fp8_matmul_triton"
    )
    with pytest.raises(EnvironmentProblem, match="runs no FP8 GEMMs"):
        gemm_backends.get_fp8_backend("triton")
    gemm_backends.register_backend("stand-in", lambda x, w: x @ w.T)
    assert gemm_backends.available_backends()["stand-in"] is None
    with pytest.raises(EnvironmentProblem, match="unknown GEMM backend"):
        gemm_backends.get_backend("nope")
    if not torch.cuda.is_available():
        assert "CUDA" in backends["cublas"]
        with pytest.raises(EnvironmentProblem, match="cublas"):
            gemm_backends.get_backend("cublas")
        with pytest.raises(EnvironmentProblem, match="cublas"):
            gemm_backends.resolve("cublas", torch.device("cuda"))


QWEN35_27B_SHAPES = [
    (12288, 5120),
    (1024, 5120),
    (5120, 6144),
    (10240, 5120),
    (6144, 5120),
    (48, 5120),
    (17408, 5120),
    (5120, 17408),
    (248320, 5120),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n,k", QWEN35_27B_SHAPES)
def test_gpu_27b_shapes_rows_invariant(n, k):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(16, k, device="cuda", dtype=torch.bfloat16)
    out = matmul_batch_invariant(x, w)
    assert _rel_err(out, x, w) < 5e-3
    assert_rows_invariant(matmul_batch_invariant, x, w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "config",
    [GemmConfig(64, 128, 4, tma=True), GemmConfig(64, 128, 4), GemmConfig(128, 128, 1, tma=True)],
)
def test_gpu_split_and_tma_variants_rows_invariant(config):
    w = torch.randn(5120, 17408, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(16, 17408, device="cuda", dtype=torch.bfloat16)
    fn = lambda a, b: matmul_batch_invariant(a, b, config=config)  # noqa: E731
    assert _rel_err(fn(x, w), x, w) < 5e-3
    assert_rows_invariant(fn, x, w)


# ---------------------------------------------------------------- prologues: the row op fused in


def _prologue_rows(kind: str, m: int, heads: int, d: int, dtype, device, seed: int = 0):
    """x and a function of a row index giving (x rows, their Prologue), the prologue's inputs
    laid out as the model has them: the gate interleaved with q, z a slice of a projection."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    if kind == "swiglu":
        x = rand(m, 2 * heads * d)
        return x, lambda idx: (x[idx], gemm.SwiGLU())
    x = rand(m, heads * d)
    if kind == "sigmoid_gate":
        gate = rand(m, heads, 2 * d)[..., d:]
        return x, lambda idx: (x[idx], gemm.SigmoidGate(gate[idx]))
    z = rand(m, 3 * heads * d)[:, heads * d : 2 * heads * d].view(m, heads, d)
    weight = rand(d)
    return x, lambda idx: (x[idx], gemm.GatedRmsNorm(z[idx], weight, 1e-6))


def _assert_prologue_rows_invariant(rows, w, config=None) -> None:
    m = rows(slice(None))[0].shape[0]
    mm = lambda idx: matmul_batch_invariant(  # noqa: E731
        rows(idx)[0], w, prologue=rows(idx)[1], config=config
    )
    full = mm(slice(None))
    for n in range(1, m + 1):
        assert torch.equal(mm(slice(0, n)), full[:n]), f"M={n}"
    for i in range(m):
        assert torch.equal(mm(slice(i, i + 1)), full[i : i + 1]), f"row {i} alone"
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(1)).to(w.device)
    assert torch.equal(mm(perm), full[perm])


PROLOGUES = ["swiglu", "sigmoid_gate", "gated_norm"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter shapes; the GPU test below")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("config", [None, GemmConfig(32, 64, 2), GemmConfig(32, 64, 1, tma=True)])
@pytest.mark.parametrize("kind", PROLOGUES)
def test_prologue_rows_are_batch_invariant(kind, config, dtype):
    x, rows = _prologue_rows(kind, 16, 4, 32, dtype, DEVICE)
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(3)).to(dtype)
    _assert_prologue_rows_invariant(rows, w, config)


def _fused_and_unfused(kind, m, heads, d, n, dtype, device):
    x, rows = _prologue_rows(kind, m, heads, d, dtype, device)
    w = torch.randn(n, heads * d, generator=torch.Generator().manual_seed(4)).to(dtype).to(device)
    x, prologue = rows(slice(None))
    fused = matmul_batch_invariant(x, w, prologue=prologue)
    return fused, matmul_batch_invariant(prologue.rows(x), w), prologue.rows(x), w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kind", PROLOGUES)
def test_prologue_computes_the_row_kernel_then_the_gemm(kind, dtype):
    """SwiGLU and the output gate are the row kernel's own formula with one rounding, so the
    operand has its bits and the fused GEMM equals the two launches bit for bit; the gated
    norm reduces its head in another tile shape than the row kernel: the same model, close."""
    fused, unfused, operand, w = _fused_and_unfused(kind, 5, 4, 32, 48, dtype, DEVICE)
    if kind == "gated_norm":
        assert _rel_err(fused, operand, w) < (1e-2 if dtype == torch.bfloat16 else 1e-6)
    else:
        assert torch.equal(fused, unfused)


def test_prologue_inputs_must_pair_with_x():
    x = torch.randn(3, 128)
    with pytest.raises(ValueError, match="do not pair"):
        matmul_batch_invariant(
            x, torch.randn(8, 128), prologue=gemm.SigmoidGate(torch.randn(2, 4, 32))
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "kind,heads,d,n",
    [("swiglu", 1, 17408, 5120), ("sigmoid_gate", 24, 256, 5120), ("gated_norm", 48, 128, 5120)],
)
def test_gpu_27b_prologues_rows_invariant(kind, heads, d, n):
    """The 27B shape's down_proj, o_proj and out_proj with their row ops fused in: rows
    invariant across M, and next to the two-launch path (equal bits where the test above
    says so; on the GPU the gated norm's other reduction tree may differ in the last bit)."""
    x, rows = _prologue_rows(kind, 16, heads, d, torch.bfloat16, "cuda")
    w = torch.randn(n, heads * d, device="cuda", dtype=torch.bfloat16) * (heads * d) ** -0.5
    _assert_prologue_rows_invariant(rows, w)
    fused, unfused, operand, w = _fused_and_unfused(kind, 16, heads, d, n, torch.bfloat16, "cuda")
    assert _rel_err(fused, operand, w) < 1e-2  # against the weight this GEMM used


# ---------------------------------------------------------------- epilogue: SwiGLU of gate_up


def _swiglu_epilogue_check(x: torch.Tensor, w: torch.Tensor, config=None) -> None:
    """The gate_up GEMM with SwiGLU in its epilogue: the bits of the GEMM then `swiglu_rows`,
    every row as in every prefix M, alone and in another row order."""
    fn = lambda a, b: matmul_batch_invariant(a, b, swiglu_out=True, config=config)  # noqa: E731
    fused = fn(x, w)
    assert torch.equal(fused, swiglu_rows(matmul_batch_invariant(x, w, config=config)))
    assert_rows_invariant(fn, x, w)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter shapes; the GPU test below")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "config,inter", [(None, 40), (GemmConfig(32, 64, 2), 48), (GemmConfig(16, 32, 4), 24)]
)
def test_swiglu_epilogue_is_the_gemm_then_swiglu_rows(config, inter, dtype):
    """Intermediate sizes a tile's half divides and does not (masked channels), with split-K."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(2 * inter, 128, generator=g).to(dtype)
    x = torch.randn(12, 128, generator=g).to(dtype)
    _swiglu_epilogue_check(x, w, config)


def test_swiglu_epilogue_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="SwiGLU epilogue"):
        gemm.launch(torch.randn(2, 64), torch.randn(33, 64), GemmConfig(32, 32, 1), None, True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_27b_gate_up_with_swiglu_epilogue():
    w = torch.randn(34816, 5120, device="cuda", dtype=torch.bfloat16) * 5120**-0.5
    x = torch.randn(16, 5120, device="cuda", dtype=torch.bfloat16)
    _swiglu_epilogue_check(x, w)
