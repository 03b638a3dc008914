"""Per-sequence decoding state and how a verify step rolls it back to the accepted prefix.

Attention layers keep a preallocated KV cache: rolling back is only moving `length`,
because rejected positions are overwritten by the next step. GDN layers keep a conv
window and an fp32 recurrent state; a multi-token step records the state after every
token (`GdnSteps`) so accepting j tokens restores exactly the state after token j.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdash.engine.config import ModelConfig

Tensor = torch.Tensor


@dataclass(slots=True)
class KVCache:
    k: Tensor  # [Hkv, capacity, D]
    v: Tensor  # [Hkv, capacity, D]


@dataclass(slots=True)
class GdnState:
    conv: Tensor  # [W-1, C] last conv inputs
    ssm: Tensor  # fp32 [HV, Dk, Dv]


@dataclass(slots=True)
class GdnSteps:
    """What one multi-token step left behind in a GDN layer, for `SeqState.commit`."""

    conv_seq: Tensor  # [W-1+T, C] window followed by the T new conv inputs
    states: Tensor  # fp32 [T, HV, Dk, Dv] state after each token


@dataclass(slots=True)
class SeqState:
    kv: dict[int, KVCache]
    gdn: dict[int, GdnState]
    capacity: int
    length: int = 0
    pending: dict[int, GdnSteps] = field(default_factory=dict)
    position: Tensor | None = None
    """`length` mirrored on the device (CUDA): a captured CUDA graph reads positions from it."""
    in_place: bool = False
    """Store GDN updates into the existing buffers: the engine sets it on its CUDA-graph slots,
    whose graphs hold these addresses. Otherwise new tensors replace them, which saves a copy
    and lets `ModelDrafter` snapshot a state by reference."""

    @classmethod
    def empty(
        cls, cfg: ModelConfig, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> SeqState:
        kv, gdn = {}, {}
        for i, lt in enumerate(cfg.layer_types):
            if lt == "full_attention":
                shape = (cfg.num_key_value_heads, capacity, cfg.head_dim)
                kv[i] = KVCache(
                    torch.zeros(shape, dtype=dtype, device=device),
                    torch.zeros(shape, dtype=dtype, device=device),
                )
            else:
                gdn[i] = GdnState(
                    torch.zeros(
                        cfg.linear_conv_kernel_dim - 1, cfg.gdn_conv_dim, dtype=dtype, device=device
                    ),
                    torch.zeros(
                        cfg.linear_num_value_heads,
                        cfg.linear_key_head_dim,
                        cfg.linear_value_head_dim,
                        dtype=torch.float32,
                        device=device,
                    ),
                )
        position = None
        if device.type == "cuda":
            position = torch.zeros(1, dtype=torch.int64, device=device)
        return cls(kv=kv, gdn=gdn, capacity=capacity, position=position)

    def advance(self, rows: int) -> None:
        self.length += rows
        if self.position is not None:
            self.position.add_(rows)

    def rewind(self, length: int) -> None:
        """Back to an earlier length (KV past it is stale and gets overwritten)."""
        self.length = length
        if self.position is not None:
            self.position.fill_(length)

    def store_gdn(self, i: int, conv: Tensor, ssm: Tensor) -> None:
        st = self.gdn[i]
        if self.in_place:
            st.conv.copy_(conv)
            st.ssm.copy_(ssm)
        else:
            st.conv, st.ssm = conv, ssm

    def reset(self) -> None:
        """Empty again, keeping the buffers (and so any CUDA graph captured on them)."""
        for g in self.gdn.values():
            g.conv.zero_()
            g.ssm.zero_()
        self.rewind(0)
        self.pending = {}

    def copy_from(self, other: SeqState) -> None:
        """Become `other` (a prefilled state) without moving any buffer."""
        n = other.length
        for i, c in self.kv.items():
            c.k[:, :n].copy_(other.kv[i].k[:, :n])
            c.v[:, :n].copy_(other.kv[i].v[:, :n])
        for i, g in self.gdn.items():
            g.conv.copy_(other.gdn[i].conv)
            g.ssm.copy_(other.gdn[i].ssm)
        self.rewind(n)
        self.pending = {}

    def commit(self, rows: int) -> None:
        """Keep the first `rows` tokens of the last step; drop the rest.

        The KV of dropped rows stays in the cache past `length` and is overwritten later.
        """
        self.apply_commit(self.pending, rows)
        self.keep(rows)

    def apply_commit(self, pending: dict[int, GdnSteps], rows: int) -> None:
        """The device side of `commit`: conv windows, GDN states and the device position. Its
        own method so that the engine can capture it as a CUDA graph (`graphs.CapturedForward`)."""
        w = next(iter(self.gdn.values())).conv.shape[0] if self.gdn else 0
        for i, steps in pending.items():
            self.store_gdn(i, steps.conv_seq[rows : rows + w], steps.states[rows - 1])
        if self.position is not None:
            self.position.add_(rows)

    def keep(self, rows: int) -> None:
        """The host side of `commit`, after the device side ran eagerly or as a graph."""
        self.length += rows
        self.pending = {}


def take_fitting(pool: list[SeqState], capacity: int) -> SeqState | None:
    """The first state in `pool` with room for `capacity` tokens, removed and reset (its
    buffers, and any graph captured on them, serve again); None if none fits."""
    for j, state in enumerate(pool):
        if state.capacity >= capacity:
            del pool[j]  # by index: list.remove would compare the tensors with ==
            state.reset()
            return state
    return None
