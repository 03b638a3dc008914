"""SPECDASH_PDL picks the programmatic-dependent-launch mode; without CUDA every kernel launches
plainly whatever the mode (the GPU test checks all three modes give the same bits)."""

from __future__ import annotations

import importlib

import pytest
import torch

from specdash.kernels.triton import pdl


@pytest.mark.parametrize(
    ("value", "mode"), [(None, pdl.EARLY), ("late", pdl.LATE), ("0", pdl.OFF), ("bogus", pdl.EARLY)]
)
def test_the_environment_picks_the_mode(monkeypatch, value: str | None, mode: int) -> None:
    if value is None:
        monkeypatch.delenv("SPECDASH_PDL", raising=False)
    else:
        monkeypatch.setenv("SPECDASH_PDL", value)
    try:
        picked = importlib.reload(pdl).MODE
        assert picked == mode
        assert pdl.use_pdl(torch.device("cpu")) == pdl.OFF
    finally:
        monkeypatch.undo()
        importlib.reload(pdl)
