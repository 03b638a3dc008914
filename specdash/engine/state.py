"""Per-sequence decoding state and how a verify step rolls it back to the accepted prefix.

Attention layers keep a preallocated KV cache: rolling back is only moving `length`,
because rejected positions are overwritten by the next step. GDN layers keep a conv
window and an fp32 recurrent state; a multi-token step records the state after every
token (`GdnSteps`) so accepting j tokens restores exactly the state after token j.

A `SlotPool` holds many states' buffers in one tensor per layer (slot s is index s), so the
row kernels serve a batch of sequences, wherever their slots are, in one launch per op, and
`commit_batch` commits them in one gather and copy per GDN layer.
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
    pool: SlotPool | None = None
    """The pool whose slot `slot` holds this state's buffers (views), if any."""
    slot: int = -1
    in_place: bool = False
    """Store GDN updates into the existing buffers: the engine sets it on its CUDA-graph slots,
    whose graphs hold these addresses. On the Triton rows a decode row (always kept) updates
    them inside the forward (`rows.gdn.TritonGdn._decodes_in_place`); its commit only moves
    the length. Otherwise new tensors replace them, which saves a copy and lets `ModelDrafter`
    snapshot a state by reference."""

    @classmethod
    def empty(
        cls, cfg: ModelConfig, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> SeqState:
        kv, gdn = _buffers(cfg, capacity, dtype, device, ())
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
        """Keep layer i's conv window and recurrent state. They arrive as views of bigger
        buffers (a prefill chunk's whole conv sequence, every verify step's state), so they are
        copied out: a kept view would pin its buffer for the state's life (16 GB over the 48 GDN
        layers after one 16k-token chunk at the 27B shape)."""
        st = self.gdn[i]
        if self.in_place:
            st.conv.copy_(conv)
            st.ssm.copy_(ssm)
        else:
            st.conv, st.ssm = conv.clone(), ssm.clone()

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
        if self.pool is not None:  # a pooled run's GDN steps are the run's, not the state's
            stepped = (st for p in self.pool.pending for st in p.states)
            assert all(st is not self for st in stepped), "commit a pooled run with commit_batch"
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


def _buffers(
    cfg: ModelConfig, capacity: int, dtype: torch.dtype, device: torch.device, lead: tuple[int, ...]
) -> tuple[dict[int, KVCache], dict[int, GdnState]]:
    """Zeroed KV caches and GDN states of every layer, each with leading dims `lead`."""
    kv, gdn = {}, {}
    for i, lt in enumerate(cfg.layer_types):
        if lt == "full_attention":
            shape = (*lead, cfg.num_key_value_heads, capacity, cfg.head_dim)
            kv[i] = KVCache(
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
        else:
            conv = (*lead, cfg.linear_conv_kernel_dim - 1, cfg.gdn_conv_dim)
            ssm = (*lead, cfg.linear_num_value_heads, cfg.linear_key_head_dim)
            gdn[i] = GdnState(
                torch.zeros(conv, dtype=dtype, device=device),
                torch.zeros((*ssm, cfg.linear_value_head_dim), dtype=torch.float32, device=device),
            )
    return kv, gdn


@dataclass(slots=True)
class PooledSteps:
    """GDN steps of several slots of one pool from one batched forward, for `commit_batch`."""

    pool: SlotPool
    states: list[SeqState]
    slots: Tensor  # [B]
    steps: dict[int, GdnSteps]  # conv_seq [B, W-1+T, C], states [B, T, HV, Dk, Dv]


class SlotPool:
    """`slots` states of `capacity` tokens in one tensor per layer: kv k/v [S, Hkv, cap, D],
    gdn conv [S, W-1, C] and ssm [S, HV, Dk, Dv]. `states[s]` is slot s, views into these, kept
    in place (so CUDA graphs captured on a slot stay valid). One more slot, `scratch`, is never
    handed out: a captured batch pads its size to a power of two with it."""

    def __init__(
        self, cfg: ModelConfig, slots: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        slots += 1  # the scratch slot
        self.kv, self.gdn = _buffers(cfg, capacity, dtype, device, (slots,))
        self.capacity, self.device = capacity, device
        self.conv_window = cfg.linear_conv_kernel_dim - 1
        self.pending: list[PooledSteps] = []
        """Batched GDN steps of the last forward, until committed."""
        self.position = None
        """Every slot's `position` (CUDA), so a batch's positions move in one launch."""
        if device.type == "cuda":
            self.position = torch.zeros(slots, dtype=torch.int64, device=device)
        self.states: list[SeqState] = []
        for s in range(slots):
            position = None if self.position is None else self.position[s : s + 1]
            self.states.append(
                SeqState(
                    kv={i: KVCache(c.k[s], c.v[s]) for i, c in self.kv.items()},
                    gdn={i: GdnState(g.conv[s], g.ssm[s]) for i, g in self.gdn.items()},
                    capacity=capacity,
                    position=position,
                    pool=self,
                    slot=s,
                    in_place=True,
                )
            )
        self.scratch = self.states.pop()

    def step_together(self, states: list[SeqState]) -> PooledSteps:
        """Record that `states` (slots of this pool) step in one batched forward: their GDN steps
        go into the returned PooledSteps, for `commit_batch`. Replaces any earlier uncommitted
        record of these states."""
        ids = {id(st) for st in states}
        slots = torch.tensor([st.slot for st in states], device=self.device)
        run = PooledSteps(self, states, slots, {})
        self.pending = [p for p in self.pending if not ids & {id(st) for st in p.states}] + [run]
        return run

    def apply_commit(self, run: PooledSteps, kept: Tensor) -> None:
        """The device side of committing `run`, `kept[b]` rows of its sequence b: one gather and
        one copy per GDN buffer and one position update. Reads `kept` on the device only, so a
        CUDA graph of it (`graphs.CapturedBatch`) serves any kept rows."""
        b = torch.arange(len(run.states), device=kept.device)
        last = kept - 1  # the state after the last kept row
        window = kept[:, None] + torch.arange(self.conv_window, device=kept.device)  # kept window
        for i, steps in run.steps.items():
            g = self.gdn[i]
            g.ssm.index_copy_(0, run.slots, steps.states[b, last])
            g.conv.index_copy_(0, run.slots, steps.conv_seq[b[:, None], window])
        if self.position is not None:
            self.position.index_add_(0, run.slots, kept)


def commit_batch(states: list[SeqState], rows: list[int]) -> None:
    """`state.commit(n)` for every state of the last (batched) forward: the states that a pooled
    forward stepped together are committed by one gather and one copy per GDN layer and buffer;
    the others one by one. The same copies, so the same bits, as `commit`."""
    keep = {id(st): n for st, n in zip(states, rows, strict=True)}
    for pool in {id(st.pool): st.pool for st in states if st.pool is not None}.values():
        for run in pool.pending:
            if not all(id(st) in keep for st in run.states):
                continue  # not stepped by this commit's forward: dropped below
            kept = [keep.pop(id(st)) for st in run.states]
            pool.apply_commit(run, torch.tensor(kept, device=run.slots.device))
            for st, k in zip(run.states, kept, strict=True):
                st.keep(k)
        pool.pending = []
    for st in states:
        if id(st) in keep:
            st.commit(keep[id(st)])


def take_fitting(pool: list[SeqState], capacity: int) -> SeqState | None:
    """The first state in `pool` with room for `capacity` tokens, removed and reset (its
    buffers, and any graph captured on them, serve again); None if none fits."""
    for j, state in enumerate(pool):
        if state.capacity >= capacity:
            del pool[j]  # by index: list.remove would compare the tensors with ==
            state.reset()
            return state
    return None
