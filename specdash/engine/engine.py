"""Speculative decoding with a shadow: the mechanics of a batch of sequences, no events, no I/O.

Greedy acceptance (gpt-fast's `speculative_decode`, greedy case), `accept`:
  rows = [last token, d1..dk] go through the target in one verify step; row i predicts
  t_{i+1}. Keep the longest prefix with d_i == t_i (a drafts), emit t_1..t_{a+1}: the a
  accepted drafts plus one bonus token from row a, up to the first end-of-text. The state
  keeps the row that predicted each emitted token: rows 0..a.

The shadow is a plain greedy decode of the same prompt on the same weights, started
from the same prefill and advanced to the same position after every step, so each
emitted token is compared (id and fp32 logprob bits) the moment both exist.
What makes the verify rows equal the shadow's decode rows: docs/exactness.md.

Batching (continuous, as nano-vllm's scheduler): `spec_step` takes a list of sequences and
verifies all their rows in one forward (`Model.forward_batch`: GEMM M = every row of every
sequence; attention and GDN on each sequence's own slot, one launch per op for the sequences
with as many rows when `reserve` made their slots one `SlotPool`); acceptance stays per
sequence, the commit is one batched copy per GDN buffer (`state.commit_batch`), and the
step's ids and log-probs reach the host in one copy (`greedy_to_host`).
Batch-invariant GEMMs and per-row reductions make each row's bits independent of its
neighbours, so a sequence's output is the same at any batch size (tests/engine/test_batch_exact.py).

Every decode and verify forward, the speculative run's and the shadow's, goes through one
dispatcher (`Engine._forward`). On CUDA the engine, not the model, owns the CUDA graphs (as
nano-vllm's `ModelRunner` and mini-sglang's `Engine` do): states are reusable slots; a forward
on one slot replays a graph captured once per (slot, rows, GEMM backend, mode)
(`graphs.CapturedForward`), a batch of pool slots with as many rows each one captured per
padded size (`graphs.CapturedBatch`), and each commits through a graph too; prefill, observed
forwards, other batches and rows that read host-side lengths run eagerly. `reserve` sizes the
slots once per session, so memory stays flat over mixed prompt lengths.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate

import torch

from specdash.engine import graphs, ops
from specdash.engine.drafters import Drafter
from specdash.engine.model import Model, Observer
from specdash.engine.rows import Mode
from specdash.engine.state import SeqState, SlotPool, commit_batch, take_fitting
from specdash.kernels.gemm_backends import GemmBackend
from specdash.metrics import Comparison

Tensor = torch.Tensor
Commit = Callable[[list[int]], None]
"""Keep `kept[b]` rows of the last forward's state b."""


@dataclass(slots=True)
class StepRecord:
    """What a verify step did, enough to replay it bit for bit."""

    rows: list[int]
    mode: Mode
    gemm: GemmBackend
    accepted: int
    batch: list[Sequence] = field(default_factory=list)
    """Every sequence of the step's forward (this one among them), in `spec_step`'s order, one
    list shared by their records: a row's bits can depend on the whole forward's layout (a
    CPU GEMM's on M), so replaying a step means replaying its batch."""


@dataclass(slots=True)
class Sequence:
    index: int
    prompt: list[int]
    capacity: int
    state: SeqState
    shadow: SeqState | None
    drafter: Drafter
    context: list[int] = field(default_factory=list)  # prompt + emitted; last not yet in state
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    shadow_ids: list[int] = field(default_factory=list)
    shadow_logprobs: list[float] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    comparison: Comparison = field(default_factory=Comparison)
    """The shadow's tokens against these, as the shadow produces them."""
    shadow_rows: dict[int, Tensor] = field(default_factory=dict)
    """The shadow's logprob row where the runs first diverge (bits, text): how close its
    choice was."""
    done: bool = False

    @property
    def compared(self) -> int:
        return min(len(self.ids), len(self.shadow_ids))

    @property
    def diverged_at(self) -> int | None:
        """The first index whose id or fp32 logprob bits differ from the shadow's."""
        return self.comparison.bits_at


@dataclass(slots=True, kw_only=True)
class StepResult:
    """One sequence's verify step. Times: its own drafting, and an equal share of the batch's
    verify, commit and shadow time (so the batch's shares sum to the batch's)."""

    drafts: list[int]
    emitted: list[int]
    logprobs: list[float]
    accepted: int
    draft_s: float
    verify_s: float
    shadow_s: float
    rollback_s: float


def accept(drafts: list[int], target: list[int], eos_ids: Container[int]) -> tuple[int, int]:
    """(accepted drafts, emitted tokens) of one sequence's verify step, greedy.

    drafts: [n] d_1..d_n; target: [n + 1] t_1..t_{n+1}, the target's greedy token of each row
    (row 0 holds the last emitted token, row i holds d_i; row i predicts t_{i+1}).
    Accept while d_i == t_i; emit t_1..t_{a+1}, the a accepted drafts and row a's bonus token,
    but nothing after an end-of-text: a drafted end-of-text ends the step, with no bonus, and
    the drafts after it are neither emitted nor accepted.
    """
    a = 0
    while a < len(drafts) and drafts[a] == target[a]:
        a += 1
    emitted = next((j + 1 for j, t in enumerate(target[: a + 1]) if t in eos_ids), a + 1)
    return min(a, emitted), emitted


def batch_order(rows: list[list[int]]) -> list[int]:
    """The order a batched forward lays its sequences' rows out in: by row count, so that
    sequences with as many rows sit side by side and step together (`Rows.run`); stable."""
    return sorted(range(len(rows)), key=lambda j: len(rows[j]))


def greedy_to_host(logprobs: Tensor) -> tuple[list[int], list[float]]:
    """`ops.greedy` of every row of logprobs [R, V] on the host: ids [R] and fp32 log-probs [R],
    in one copy (one sync) as one float64 [2, R] tensor, which holds both exactly (ids are
    below 2**53; every fp32 is a float64)."""
    ids, lps = ops.greedy(logprobs)
    host_ids, host_lps = torch.stack((ids.double(), lps.double())).tolist()
    return [int(t) for t in host_ids], host_lps


class Engine:
    def __init__(
        self, target: Model, make_drafter: Callable[[], Drafter], eos_ids: list[int]
    ) -> None:
        self.target, self.make_drafter, self.eos_ids = target, make_drafter, set(eos_ids)
        self.cuda_graphs = target.device.type == "cuda" and target.rows["exact"].graphable
        """Capture the decode/verify forwards as CUDA graphs on reusable state slots: on CUDA
        with the row kernels, which read every position on the device (the per-row torch path
        slices by host-side lengths, which a graph would freeze)."""
        self.slot_capacity = 0
        """Graphed states are allocated at least this large, so later prompts reuse them."""
        self.reserved = False
        """`reserve` was called: states are pooled slots on every device."""
        self._slots: list[SeqState] = []
        """Every graphed state ever allocated; its index names it in `_graphs`."""
        self._free_slots: list[SeqState] = []
        self._graphs: dict[tuple[int, int, str, Mode], graphs.CapturedForward] = {}
        """Captured forwards by (slot, rows, GEMM backend, mode): switching backend selects (or
        captures) another graph at the next step, never mid-step."""
        self._batch_graphs: dict[tuple[int, int, int, str, Mode], graphs.CapturedBatch] = {}
        """Captured batches by (pool, padded size, rows, GEMM backend, mode)."""
        self._batch_mempool: graphs.GraphPool | None = None
        """One graph memory pool for every captured batch: their temporaries share it."""
        self.fault: Callable[[int], Observer | None] | None = None
        """Verify-step index -> observer for the speculative run (fault-injection tests)."""

    def reserve(
        self, max_prompt_tokens: int, max_new_tokens: int, k_max: int, sequences: int, shadow: bool
    ) -> None:
        """Allocate the session's state slots once, each sized for its longest prompt
        (`start`'s capacity rule), for `sequences` in flight (and their shadows), and reuse
        them for every prompt: memory reaches its level here and stays there, whatever the
        prompt lengths (with a state per prompt, RSS would follow each prompt's KV). Call
        before the first `start`; a longer prompt later still gets a (larger) slot of its own."""
        m = self.target
        self.reserved = True
        self.slot_capacity = max(self.slot_capacity, max_prompt_tokens + max_new_tokens + k_max + 1)
        want = sequences * (2 if shadow else 1) - len(self._free_slots)
        if want > 0:  # one pool: a batch of its slots steps in one launch per op
            pool = SlotPool(m.cfg, want, self.slot_capacity, m.dtype, m.device)
            self._slots += pool.states
            self._free_slots += pool.states

    @property
    def pooled(self) -> bool:
        """States are reusable slots (CUDA graphs, or after `reserve`), handed back by `release`."""
        return self.cuda_graphs or self.reserved

    def _tensor(self, tokens: list[int]) -> Tensor:
        return torch.tensor(tokens, device=self.target.device)

    def start(
        self, index: int, prompt: list[int], max_new_tokens: int, k_max: int, shadow: bool
    ) -> tuple[Sequence, float]:
        """Prefill the prompt once; the shadow starts from a copy of the same state."""
        t0 = time.perf_counter()
        m = self.target
        capacity = len(prompt) + max_new_tokens + k_max + 1
        state = self._new_state(capacity)
        ids, lps = greedy_to_host(m.forward(self._tensor(prompt), state, "prefill"))
        shadow_state = None
        if shadow:
            shadow_state = self._new_state(capacity)
            shadow_state.copy_from(state)
        drafter = self.make_drafter()
        seq = Sequence(index, prompt, capacity, state, shadow_state, drafter)
        first, first_lp = ids[0], lps[0]
        seq.context = [*prompt, first]
        seq.ids, seq.logprobs = [first], [first_lp]
        if shadow:
            seq.shadow_ids, seq.shadow_logprobs = [first], [first_lp]
        seq.done = first in self.eos_ids or max_new_tokens <= 1
        drafter.start(prompt, max(capacity, self.slot_capacity) if self.reserved else capacity)
        return seq, time.perf_counter() - t0

    def _new_state(self, capacity: int) -> SeqState:
        m = self.target
        if not self.pooled:
            return SeqState.empty(m.cfg, capacity, m.dtype, m.device)
        if (slot := take_fitting(self._free_slots, capacity)) is not None:
            return slot
        slot = SeqState.empty(m.cfg, max(capacity, self.slot_capacity), m.dtype, m.device)
        slot.in_place = True
        self._slots.append(slot)
        return slot

    def release(self, seq: Sequence) -> None:
        """The sequence is finished: its slots (and their graphs) serve the next one."""
        if self.pooled:
            self._free_slots += [s for s in (seq.state, seq.shadow) if s is not None]
        release = getattr(seq.drafter, "release", None)
        if release is not None:  # a model drafter's state serves the next sequence
            release()

    def spec_step(
        self, seqs: list[Sequence], k: int, mode: Mode, max_new_tokens: int
    ) -> list[StepResult]:
        """One verify step of every sequence in `seqs`, in one forward: each drafts up to k
        tokens (k = 0: a plain decode step), the target verifies every row, `accept` decides
        per sequence, the states commit together; then the shadows catch up, batched too.
        Results in `seqs`' order."""
        before = [len(seq.ids) for seq in seqs]
        drafts, draft_s = [], []
        for seq in seqs:
            d0 = time.perf_counter()
            n = min(k, max_new_tokens - len(seq.ids) - 1)  # a step emits up to n + 1 tokens
            drafts.append(seq.drafter.propose(seq.context, n) if n > 0 else [])
            draft_s.append(time.perf_counter() - d0)
        t1 = time.perf_counter()
        step_rows = [[seq.context[-1], *d] for seq, d in zip(seqs, drafts, strict=True)]
        order = batch_order(step_rows)
        batch = [seqs[b] for b in order]
        rows = [step_rows[b] for b in order]  # [B][1 + n_b], as the forward lays them out
        starts = [0, *accumulate(len(r) for r in rows[:-1])]  # [B]: each one's first row
        observer = self.fault(len(batch[0].steps)) if self.fault and len(batch) == 1 else None
        logprobs, commit = self._forward([s.state for s in batch], rows, mode, observer)
        target, target_lps = greedy_to_host(logprobs)  # [sum(1 + n_b)] each
        verdicts = [
            accept(r[1:], target[s : s + len(r)], self.eos_ids)
            for r, s in zip(rows, starts, strict=True)
        ]  # (accepted, emitted) per sequence
        t2 = time.perf_counter()
        commit([emitted for _, emitted in verdicts])  # the row that predicted each token
        in_forward = list(seqs)  # `StepRecord.batch`: one list shared by the step's records
        for seq, r, s, (accepted, emitted) in zip(batch, rows, starts, verdicts, strict=True):
            ids = target[s : s + emitted]
            seq.steps.append(StepRecord(r, mode, self.target.gemm, accepted, in_forward))
            seq.context.extend(ids)
            seq.ids.extend(ids)
            seq.logprobs.extend(target_lps[s : s + emitted])
            seq.done = ids[-1] in self.eos_ids or len(seq.ids) >= max_new_tokens
            seq.drafter.accept(seq.context, accepted)
        t3 = time.perf_counter()
        shadow_s = self.shadow_catch_up(seqs)
        n = len(seqs)
        return [
            StepResult(
                drafts=d,
                emitted=seq.ids[j:],
                logprobs=seq.logprobs[j:],
                accepted=seq.steps[-1].accepted,
                draft_s=ds,
                verify_s=(t2 - t1) / n,
                shadow_s=shadow_s / n,
                rollback_s=(t3 - t2) / n,
            )
            for seq, d, j, ds in zip(seqs, drafts, before, draft_s, strict=True)
        ]

    def teacher_forced(self, prompt: list[int], path: list[int], rows: int) -> Iterator[Tensor]:
        """The target's log-prob rows along a given path (another run's tokens): [1, V] from
        the prompt's prefill, predicting path[0], then [n, V] per forward, row j predicting
        path[j] from path[:j], `rows` rows a forward in exact mode, as a verify step of drafts
        `path` lays them out. Those are decode's bits, so along a path this model decoded
        itself the rows give back its own logprobs. A yielded tensor holds until the next is
        asked for (a graph's replay overwrites its output)."""
        state = self._new_state(len(prompt) + len(path) + rows)
        try:
            yield self.target.forward(self._tensor(prompt), state, "prefill")
            for start in range(0, len(path) - 1, rows):
                chunk = path[start : min(start + rows, len(path) - 1)]
                logprobs, commit = self._forward([state], [chunk], "exact")
                yield logprobs
                commit([len(chunk)])
        finally:
            if self.pooled:
                self._free_slots.append(state)

    def shadow_catch_up(self, seqs: list[Sequence]) -> float:
        """Decode the shadows up to their speculative runs' lengths, one batched decode row per
        lagging sequence per forward, comparing as they go. A shadow runs to the end after a
        divergence too (its own greedy path), so a later change of the text is seen, and its
        time is always real."""
        t0 = time.perf_counter()
        while lag := [s for s in seqs if s.shadow is not None and len(s.shadow_ids) < len(s.ids)]:
            states = [s.shadow for s in lag if s.shadow is not None]
            logprobs, commit = self._forward(states, [[s.shadow_ids[-1]] for s in lag], "exact")
            commit([1] * len(lag))
            for i, (seq, tok, tok_lp) in enumerate(
                zip(lag, *greedy_to_host(logprobs), strict=True)
            ):
                if self._compare(seq, tok, tok_lp):
                    seq.shadow_rows[len(seq.shadow_ids) - 1] = logprobs[i].clone()
        return time.perf_counter() - t0

    def _forward(
        self,
        states: list[SeqState],
        rows: list[list[int]],
        mode: Mode,
        observer: Observer | None = None,
    ) -> tuple[Tensor, Commit]:
        """`rows[b]` through the target at `states[b]`'s positions, all in one forward: the
        log-probs [sum of rows, V] in `states`' order, and the commit. Replays (and commits
        through) a captured graph where there is one (`_graph`); else runs eagerly, where an
        observer sees, and may change, every sub-op."""
        lens = [len(r) for r in rows]
        tokens = self._tensor([t for r in rows for t in r])
        graph = None if observer is not None else self._graph(states, lens, mode)
        if graph is not None:
            return graph.replay(tokens, states), partial(graph.commit, states)
        logprobs = self.target.forward_batch(tokens, states, lens, mode, observe=observer)
        return logprobs, partial(commit_batch, states)

    def _graph(
        self, states: list[SeqState], lens: list[int], mode: Mode
    ) -> graphs.CapturedForward | graphs.CapturedBatch | None:
        """The captured forward of `lens[b]` rows on each of `states` (captured on first use),
        after the eager forward's capacity checks. None where the forward runs eagerly: CUDA
        graphs off, rows that read host-side lengths (`Rows.graphable`), which a graph would
        freeze, a lone state that is no slot, or a batch that is not slots of one pool with as
        many rows each on rows that step slots together."""
        target, n = self.target, lens[0]
        if not self.cuda_graphs or not target.rows[mode].graphable or len(set(lens)) > 1:
            return None
        if len(states) == 1:
            slot = next((i for i, s in enumerate(self._slots) if s is states[0]), None)
            if slot is None:
                return None
            target.check_fits(states[0], n)  # a capture writes K/V at those rows too
            key = (slot, n, target.gemm.name, mode)
            if key not in self._graphs:
                self._graphs[key] = graphs.CapturedForward(target, states[0], n, mode)
            return self._graphs[key]
        pool = states[0].pool
        if not target.rows[mode].steps_slots_together or pool is None:
            return None
        if any(st.pool is not pool for st in states):
            return None
        for st in states:
            target.check_fits(st, n)
        size = 1 << (len(states) - 1).bit_length()
        batch_key = (id(pool), size, n, target.gemm.name, mode)
        if batch_key not in self._batch_graphs:
            if self._batch_mempool is None:
                self._batch_mempool = torch.cuda.graph_pool_handle()
            self._batch_graphs[batch_key] = graphs.CapturedBatch(
                target, pool, size, n, mode, self._batch_mempool
            )
        return self._batch_graphs[batch_key]

    @staticmethod
    def _compare(seq: Sequence, tok: int, tok_lp: float) -> bool:
        """Append the shadow's token; True when the runs first diverge there (bits or text)."""
        seq.shadow_ids.append(tok)
        seq.shadow_logprobs.append(tok_lp)
        return bool(
            seq.comparison.advance(seq.ids, seq.logprobs, seq.shadow_ids, seq.shadow_logprobs)
        )

    def step_of(self, seq: Sequence, position: int) -> tuple[int, int]:
        """(verify step index, row within it) that emitted generated token `position`."""
        emitted = 1  # the prefill token
        for s, rec in enumerate(seq.steps):
            n = rec.accepted + 1
            if position < emitted + n:
                return s, position - emitted
            emitted += n
        raise ValueError(f"position {position} was not emitted by a verify step")
