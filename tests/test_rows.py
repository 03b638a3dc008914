"""Which implementation computes each mode's rows, chosen once per model: exact rows are the
Triton kernels on CUDA and the torch rows on the CPU; fast verify is the batched pass on both;
prefill is batched on both, with the row kernels for its row-wise ops on CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdash.engine.config import preset
from specdash.engine.rows import (
    BatchedRows,
    PrefillRows,
    Rope,
    TorchRows,
    TritonPrefillRows,
    TritonRows,
    row_implementations,
)

CFG = replace(preset("tiny-hybrid"), linear_value_head_dim=32, max_position_embeddings=64)
ROPE = Rope.build(CFG, torch.float32, torch.device("cpu"))


def test_cuda_picks_the_row_kernels_for_exact_and_the_batched_pass_for_fast() -> None:
    rows = row_implementations(CFG, ROPE, torch.device("cuda"))
    assert type(rows["exact"]) is TritonRows and rows["exact"].graphable
    assert type(rows["fast"]) is BatchedRows and rows["fast"].graphable
    # prefill: SDPA and FLA's chunked GDN, the row kernels for the row-wise ops; never graphed
    assert type(rows["prefill"]) is TritonPrefillRows and rows["prefill"].gdn_kernel
    assert not rows["prefill"].graphable


def test_cpu_picks_the_torch_rows_for_exact_and_the_batched_pass_for_fast() -> None:
    rows = row_implementations(CFG, ROPE, torch.device("cpu"))
    assert type(rows["exact"]) is TorchRows
    assert type(rows["fast"]) is BatchedRows
    assert type(rows["prefill"]) is PrefillRows and not rows["prefill"].gdn_kernel
    assert not any(r.graphable for r in rows.values())  # eager CPU states slice by length


def test_cuda_shapes_outside_the_kernels_take_the_torch_rows() -> None:
    cfg = replace(CFG, head_dim=24)
    with pytest.warns(RuntimeWarning, match="outside the Triton row kernels"):
        rows = row_implementations(cfg, ROPE, torch.device("cuda"))
    assert type(rows["exact"]) is TorchRows and not rows["exact"].graphable
    assert type(rows["fast"]) is BatchedRows
