"""Row RMSNorm kernel: fp64 reference, and each row's bits independent of the other rows."""

from __future__ import annotations

import pytest
import torch

from specdash.kernels.triton.rmsnorm import rms_norm_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _reference(x, w, eps, zero_centred):
    x = x.double()
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * ((1 + w.double()) if zero_centred else w.double())
    return y


@pytest.mark.parametrize("n", [16, 64, 100])
@pytest.mark.parametrize("weight,zero_centred", [(False, False), (True, False), (True, True)])
def test_matches_fp64_and_rows_are_batch_invariant(n, weight, zero_centred) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(9, n, generator=g).to(DEVICE)
    w = (torch.randn(n, generator=g) * 0.1).to(DEVICE) if weight else None
    full = rms_norm_rows(x, w, 1e-6, zero_centred)
    torch.testing.assert_close(
        full.double(), _reference(x, w, 1e-6, zero_centred), rtol=1e-5, atol=1e-5
    )
    for m in (1, 2, 5, 9):
        part = rms_norm_rows(x[:m].clone(), w, 1e-6, zero_centred)
        assert torch.equal(part, full[:m])
    assert torch.equal(rms_norm_rows(x[4:5].clone(), w, 1e-6, zero_centred), full[4:5])


def test_leading_dims_are_rows() -> None:
    x = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    assert torch.equal(
        rms_norm_rows(x, None, 1e-6), rms_norm_rows(x.reshape(12, 32), None, 1e-6).reshape(3, 4, 32)
    )
