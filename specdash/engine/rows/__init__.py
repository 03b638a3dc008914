"""How a forward computes its rows: one `Rows` per mode, picked once per model.

`Model` holds a `Rows` for each mode (`row_implementations`), as mini-sglang holds an attention
backend, and its forward is one straight line through it. A `Rows` is three parts, chosen apart:

* `rowwise` (rowwise.py): norms, SwiGLU, the output gate, the causal conv, the gated norm; torch
  (`exact`: fixed-order sums) or specdash.kernels' row kernels.
* `attention` (attention.py): torch with an `attend` (per row, one SDPA call, masked by device
  positions, or the prefill kernel), or the Triton kernels.
* `gdn` (gdn.py): the torch recurrence, prefill's chunked form, or the Triton step kernels.

The compositions shipped, by what computes each mode on each device (`row_implementations`):

* `torch_rows` (exact, CPU): each row with decode's shapes, norms by a fixed-order sum.
* `triton_rows` (exact, CUDA): the fused row kernels; positions read on the device.
* `batched_rows` (fast, every device): one batched verify pass the usual way: torch's fused
  norms, one SDPA call over the k+1 rows, the GDN recurrence with batched norms.
* `prefill_rows` (prefill, CPU; `triton_prefill_rows` on CUDA, with the row kernels for its
  row-wise ops): batched, with the chunked GDN form.

What makes each exact, and the test that proves it: docs/exactness.md.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

import torch

from specdash.engine.config import ModelConfig
from specdash.engine.rows.attention import (
    Attention,
    TorchAttention,
    TritonAttention,
    attend_batched,
    attend_causal_kernel,
    attend_masked,
    attend_per_row,
)
from specdash.engine.rows.gdn import ChunkedGdn, Gdn, RecurrentGdn, TritonGdn
from specdash.engine.rows.rope import Rope
from specdash.engine.rows.rowwise import Rowwise, TorchRowwise, TritonRowwise, attention_gate
from specdash.engine.rows.run import Run, cat_rows
from specdash.engine.state import SeqState

__all__ = [
    "Mode",
    "Rope",
    "Rows",
    "Run",
    "attention_gate",
    "batched_rows",
    "cat_rows",
    "prefill_rows",
    "row_implementations",
    "torch_rows",
    "triton_prefill_rows",
    "triton_rows",
]

Mode = Literal["prefill", "exact", "fast"]
"""How a forward computes its rows; `row_implementations` gives one `Rows` per mode."""


@dataclass(eq=False)
class Rows:
    """The row-computing sub-ops of one mode: the model's GEMMs and observers stay outside."""

    rowwise: Rowwise
    attention: Attention
    gdn: Gdn
    graphable: bool = field(init=False)
    """Reads every position on the device, so a CUDA graph of it is valid at every length."""
    steps_slots_together: bool = field(init=False)
    """`run` steps slots of one pool in one launch per op, slots and positions read on the
    device, so a CUDA graph of a batch serves any slots of the pool (`graphs.CapturedBatch`)."""

    def __post_init__(self) -> None:
        self.graphable = self.attention.graphable
        self.steps_slots_together = (
            self.attention.steps_slots_together and self.gdn.steps_slots_together
        )

    def run(self, states: list[SeqState], rows: int) -> Run:
        """The run of `states`, `rows` rows each: several slots of one pool step together (one
        launch per op for all of them) where the parts can; else sequence by sequence."""
        pool = states[0].pool
        if (
            not self.steps_slots_together
            or len(states) == 1
            or pool is None
            or any(st.pool is not pool for st in states)
        ):
            return Run(states, rows)
        starts = torch.tensor([st.length for st in states], device=pool.device)
        return Run(states, rows, pool.step_together(states), starts)


def torch_rows(cfg: ModelConfig, rope: Rope) -> Rows:
    """Exact rows in torch: attention one row at a time over its own prefix, fixed-order sums.
    The CPU's exact path, and CUDA's for shapes outside the Triton kernels (not graphable: it
    slices the cache by the host-side length)."""
    rowwise = TorchRowwise(cfg, exact=True)
    attention = TorchAttention(cfg, rope, rowwise, attend_per_row)
    return Rows(rowwise, attention, RecurrentGdn(cfg, rowwise, exact=True))


def triton_rows(cfg: ModelConfig, rope: Rope) -> Rows:
    """Exact rows through specdash.kernels (CUDA; the CPU runs them under TRITON_INTERPRET):
    one program per row whose arithmetic cannot depend on the row count, positions read on the
    device, so decode and verify forwards are graphable."""
    rowwise = TritonRowwise(cfg)
    return Rows(rowwise, TritonAttention(cfg, rope), TritonGdn(cfg, rowwise))


def batched_rows(cfg: ModelConfig, rope: Rope, device_positions: bool) -> Rows:
    """Fast verify on every device: one batched pass the usual way (torch's fused norms, one
    SDPA call over the k+1 rows), not exact, for comparison. With `device_positions` (CUDA)
    attention masks the whole cache by the positions on the device instead of slicing it by the
    host-side length, so fast verify is graphed like exact."""
    rowwise = TorchRowwise(cfg, exact=False)
    attend = attend_masked if device_positions else attend_batched
    attention = TorchAttention(cfg, rope, rowwise, attend)
    return Rows(rowwise, attention, RecurrentGdn(cfg, rowwise, exact=False))


def prefill_rows(cfg: ModelConfig, rope: Rope, gdn_kernel: bool) -> Rows:
    """Prefill, shared by the speculative run and its shadow, so it need not match decode:
    batched, and GDN in the chunked form (through the kernel with `gdn_kernel`), storing the
    final state."""
    rowwise = TorchRowwise(cfg, exact=False)
    attention = TorchAttention(cfg, rope, rowwise, attend_batched)
    return Rows(rowwise, attention, ChunkedGdn(cfg, rowwise, kernel=gdn_kernel))


def triton_prefill_rows(cfg: ModelConfig, rope: Rope, attention_kernel: bool = False) -> Rows:
    """Prefill on CUDA: chunked GDN through the kernel, the fused row kernels for everything
    row-wise, where torch would make several full passes over 16k-row activations per op (5.8 s
    of a 128k prefill's kernels, docs/PERF.md). Attention: with `attention_kernel` (the default
    on Hopper) `kernels.prefill_attention`; else torch's SDPA, whose flash kernel is the one left
    for older GPUs."""
    rowwise = TritonRowwise(cfg)
    attend = attend_causal_kernel if attention_kernel else attend_batched
    attention = TorchAttention(cfg, rope, rowwise, attend)
    return Rows(rowwise, attention, ChunkedGdn(cfg, rowwise, kernel=True))


def row_implementations(cfg: ModelConfig, rope: Rope, device: torch.device) -> dict[Mode, Rows]:
    """The implementation of each mode on `device`, chosen here only: exact rows are the Triton
    kernels on CUDA (the torch rows outside their shapes or on the CPU); fast verify is the
    batched pass on every device, so it diverges the usual way on a GPU too."""
    cuda = device.type == "cuda"
    kernels = cuda and _triton_rows_supported(cfg)
    # (the CPU tests take the CUDA route through the interpreter, with no CUDA to ask)
    hopper = cuda and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 9
    return {
        "prefill": triton_prefill_rows(cfg, rope, attention_kernel=hopper)
        if kernels
        else prefill_rows(cfg, rope, gdn_kernel=False),
        "exact": triton_rows(cfg, rope) if kernels else torch_rows(cfg, rope),
        "fast": batched_rows(cfg, rope, device_positions=cuda),
    }


def _triton_rows_supported(cfg: ModelConfig) -> bool:
    """Shapes specdash.kernels' attention and GDN kernels take; others warn once and run the
    per-row torch path, which is exact too (same op, same shape per row), only slower."""
    pow2 = cfg.head_dim >= 16 and cfg.head_dim & (cfg.head_dim - 1) == 0
    dk = cfg.linear_key_head_dim
    gdn = not cfg.has_gdn or (dk & (dk - 1) == 0 and cfg.linear_value_head_dim % 32 == 0)
    if not (pow2 and gdn):
        warnings.warn(
            f"head dims (attention {cfg.head_dim}, GDN {dk}/{cfg.linear_value_head_dim}) are "
            "outside the Triton row kernels; exact rows run per row in torch",
            RuntimeWarning,
            stacklevel=4,
        )
    return pow2 and gdn
