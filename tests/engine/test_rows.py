"""Which parts compute each mode's rows, chosen once per model: exact rows are the Triton
kernels on CUDA and the torch rows on the CPU; fast verify is the batched pass on both;
prefill is batched on both, with the row kernels for its row-wise ops on CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdash.engine.config import preset
from specdash.engine.rows import Rope, Rows, row_implementations

CFG = replace(preset("tiny-hybrid"), linear_value_head_dim=32, max_position_embeddings=64)
ROPE = Rope.build(CFG, torch.float32, torch.device("cpu"))


def parts(rows: Rows) -> list[str]:
    """Each part's class and what sets it apart: its `attend`, `exact`, `kernel`."""
    out = []
    for part in (rows.rowwise, rows.attention, rows.gdn):
        words = [type(part).__name__]
        if (attend := getattr(part, "attend", None)) is not None:
            words.append(attend.__name__)
        words += [flag for flag in ("exact", "kernel") if getattr(part, flag, False)]
        out.append(" ".join(words))
    return out


def test_cuda_picks_the_row_kernels_for_exact_and_the_batched_pass_for_fast() -> None:
    rows = row_implementations(CFG, ROPE, torch.device("cuda"))
    assert parts(rows["exact"]) == ["TritonRowwise", "TritonAttention", "TritonGdn"]
    assert rows["exact"].graphable and rows["exact"].steps_slots_together
    fast = ["TorchRowwise", "TorchAttention attend_masked", "RecurrentGdn"]
    assert parts(rows["fast"]) == fast
    assert rows["fast"].graphable and not rows["fast"].steps_slots_together
    # prefill: SDPA (no Hopper to ask here) and FLA's chunked GDN, the row kernels for the
    # row-wise ops; never graphed
    prefill = ["TritonRowwise", "TorchAttention attend_batched", "ChunkedGdn kernel"]
    assert parts(rows["prefill"]) == prefill
    assert not rows["prefill"].graphable


def test_cpu_picks_the_torch_rows_for_exact_and_the_batched_pass_for_fast() -> None:
    rows = row_implementations(CFG, ROPE, torch.device("cpu"))
    exact = ["TorchRowwise exact", "TorchAttention attend_per_row", "RecurrentGdn exact"]
    assert parts(rows["exact"]) == exact
    fast = ["TorchRowwise", "TorchAttention attend_batched", "RecurrentGdn"]
    assert parts(rows["fast"]) == fast
    prefill = ["TorchRowwise", "TorchAttention attend_batched", "ChunkedGdn"]
    assert parts(rows["prefill"]) == prefill
    # eager CPU states slice by length
    assert not any(r.graphable or r.steps_slots_together for r in rows.values())


def test_cuda_shapes_outside_the_kernels_take_the_torch_rows() -> None:
    cfg = replace(CFG, head_dim=24)
    with pytest.warns(RuntimeWarning, match="outside the Triton row kernels"):
        rows = row_implementations(cfg, ROPE, torch.device("cuda"))
    exact = ["TorchRowwise exact", "TorchAttention attend_per_row", "RecurrentGdn exact"]
    assert parts(rows["exact"]) == exact and not rows["exact"].graphable
    assert parts(rows["fast"])[1] == "TorchAttention attend_masked"
