"""Speculative decoding with a shadow: the mechanics of one sequence, no events, no I/O.

Greedy acceptance (gpt-fast's `speculative_decode`, greedy case):
  rows = [last token, d1..dk] go through the target in one verify step; row i predicts
  t_{i+1}. Keep the longest prefix with d_i == t_i (a drafts), emit t_1..t_{a+1}: the a
  accepted drafts plus one bonus token from row a. The state keeps rows 0..a.

The shadow is a plain greedy decode of the same prompt on the same weights, started
from the same prefill and advanced to the same position after every step, so each
emitted token is compared (id and fp32 logprob bits) the moment both exist.
What makes the verify rows equal the shadow's decode rows: docs/exactness.md.

On CUDA the engine, not the model, owns the CUDA graphs (as nano-vllm's `ModelRunner` and
mini-sglang's `Engine` do): states are reusable slots, and a decode or verify forward on a slot
replays a graph captured once per (slot, rows, GEMM backend, mode) (`graphs.CapturedForward`),
then commits through a graph too; prefill, observed forwards and rows that read host-side
lengths run eagerly. `spec_step` and `shadow_catch_up` show both paths.

Batching (continuous, as nano-vllm's scheduler): `spec_step` takes a list of sequences and
verifies all their rows in one forward (`Model.forward_batch`: GEMM M = every row of every
sequence; attention and GDN on each sequence's own slot, one launch per op for the sequences
with as many rows when `reserve` made their slots one `SlotPool`); acceptance stays per
sequence, the commit is one batched copy per GDN buffer (`state.commit_batch`).
Batch-invariant GEMMs and per-row reductions make each row's bits independent of its
neighbours, so a sequence's output is the same at any batch size (tests/test_batch_exact.py).
On CUDA a batch of pool slots with as many rows each replays a graph too
(`graphs.CapturedBatch`, one per padded size); others run eagerly. `reserve` sizes the slots
once per session, so memory stays flat over mixed prompt lengths.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import overload

import torch

from specdash.engine import graphs, ops
from specdash.engine.drafters import Drafter
from specdash.engine.gemm_backends import GemmBackend
from specdash.engine.model import Model, Observer
from specdash.engine.rows import Mode
from specdash.engine.state import SeqState, SlotPool, commit_batch, take_fitting
from specdash.metrics import same_fp32_bits

Tensor = torch.Tensor


@dataclass(slots=True)
class StepRecord:
    """What a verify step did, enough to replay it bit for bit."""

    rows: list[int]
    mode: Mode
    gemm: GemmBackend
    accepted: int


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
    diverged_at: int | None = None  # first index whose id or logprob bits differ
    text_diverged_at: int | None = None  # first index whose token id differs
    shadow_rows: dict[int, Tensor] = field(default_factory=dict)
    """The shadow's logprob row at diverged_at and text_diverged_at: how close its choice was."""
    done: bool = False

    @property
    def compared(self) -> int:
        return min(len(self.ids), len(self.shadow_ids))


@dataclass(slots=True)
class StepResult:
    drafts: list[int]
    emitted: list[int]
    logprobs: list[float]
    accepted: int
    draft_s: float
    verify_s: float
    shadow_s: float
    rollback_s: float


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
        self._batch_mempool: tuple | None = None
        """One graph memory pool for every captured batch: their temporaries share it."""
        self.fault: Callable[[int], Observer | None] | None = None
        """Verify-step index -> observer for the speculative run (fault-injection tests)."""

    def reserve(
        self, max_prompt_tokens: int, max_new_tokens: int, k_max: int, sequences: int, shadow: bool
    ) -> None:
        """Allocate the session's state slots once, each sized for its longest prompt
        (`start`'s capacity rule), for `sequences` in flight (and their shadows), and reuse
        them for every prompt: memory reaches its level here and stays there, whatever the
        prompt lengths (issue 12's RSS peak followed each prompt's KV). Call before the first
        `start`; a longer prompt later still gets a (larger) slot of its own."""
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
        lp = m.forward(self._tensor(prompt), state, "prefill")
        ids, lps = ops.greedy(lp)
        shadow_state = None
        if shadow:
            shadow_state = self._new_state(capacity)
            shadow_state.copy_from(state)
        drafter = self.make_drafter()
        seq = Sequence(index, prompt, capacity, state, shadow_state, drafter)
        first, first_lp = int(ids[0]), float(lps[0])
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

    def _graph(self, state: SeqState, rows: int, mode: Mode) -> graphs.CapturedForward | None:
        """The captured forward of `rows` rows on `state` (captured on first use), after the
        eager forward's capacity check; None where the forward runs eagerly: a state that is no
        slot (CUDA graphs off, or the CPU), or rows that read host-side lengths
        (`Rows.graphable`), which a graph would freeze."""
        if not self.cuda_graphs:
            return None
        slot = next((i for i, s in enumerate(self._slots) if s is state), None)
        if slot is None or not self.target.rows[mode].graphable:
            return None
        self.target.check_fits(state, rows)  # a capture writes K/V at those rows too
        key = (slot, rows, self.target.gemm.name, mode)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = graphs.CapturedForward(self.target, state, rows, mode)
        return graph

    def _batch_graph(
        self, states: list[SeqState], rows: int, mode: Mode
    ) -> graphs.CapturedBatch | None:
        """The captured batch for `states`, `rows` rows each (captured on first use), after the
        eager forward's capacity checks; None where the batch runs eagerly: no CUDA graphs,
        states that are not slots of one pool, or rows that step slots one by one."""
        pool = states[0].pool
        if not self.cuda_graphs or pool is None or any(st.pool is not pool for st in states):
            return None
        if not self.target.rows[mode].steps_slots_together:
            return None
        for st in states:
            self.target.check_fits(st, rows)
        size = 1 << (len(states) - 1).bit_length()
        key = (id(pool), size, rows, self.target.gemm.name, mode)
        graph = self._batch_graphs.get(key)
        if graph is None:
            if self._batch_mempool is None:
                self._batch_mempool = torch.cuda.graph_pool_handle()
            graph = graphs.CapturedBatch(self.target, pool, size, rows, mode, self._batch_mempool)
            self._batch_graphs[key] = graph
        return graph

    @overload
    def spec_step(self, seqs: Sequence, k: int, mode: Mode, max_new_tokens: int) -> StepResult: ...
    @overload
    def spec_step(
        self, seqs: list[Sequence], k: int, mode: Mode, max_new_tokens: int
    ) -> list[StepResult]: ...
    def spec_step(
        self, seqs: Sequence | list[Sequence], k: int, mode: Mode, max_new_tokens: int
    ) -> StepResult | list[StepResult]:
        """One verify step of every sequence in `seqs`, in one forward (a list of one: the
        graphed single-sequence path; a bare `Sequence` returns its bare `StepResult`).
        Drafting, acceptance and commit stay per sequence; the shadows then catch up, batched
        too. Per-sequence times: its own draft time, and an equal share of the batch's verify,
        commit and shadow time (so they sum to the batch's)."""
        if isinstance(seqs, Sequence):
            return self.spec_step([seqs], k, mode, max_new_tokens)[0]
        drafts, draft_s = [], []
        for seq in seqs:
            room = max_new_tokens - len(seq.ids)
            d0 = time.perf_counter()
            n = min(k, room - 1)
            drafts.append(seq.drafter.propose(seq.context, n) if k > 0 and room > 1 else [])
            draft_s.append(time.perf_counter() - d0)
        t1 = time.perf_counter()
        rows = [[seq.context[-1], *d] for seq, d in zip(seqs, drafts, strict=True)]
        lps, graph = self._verify(seqs, rows, mode)
        results = []
        accepted_all = []
        for d, lp in zip(drafts, lps, strict=True):
            ids, lp_ = ops.greedy(lp)
            ids_l, lps_l = ids.tolist(), lp_.tolist()
            accepted = 0
            while accepted < len(d) and d[accepted] == ids_l[accepted]:
                accepted += 1
            accepted_all.append((accepted, ids_l, lps_l))
        t2 = time.perf_counter()
        kept = [a + 1 for a, _, _ in accepted_all]
        if graph is not None:  # a graph's batch is in `seqs`' order (one row count: unsorted)
            graph.commit([s.state for s in seqs], kept)
        else:
            commit_batch([s.state for s in seqs], kept)
        for seq, d, r, (accepted, ids_l, lps_l) in zip(
            seqs, drafts, rows, accepted_all, strict=True
        ):
            emitted, emitted_lp = ids_l[: accepted + 1], lps_l[: accepted + 1]
            for j, tok in enumerate(emitted):  # stop at end of sequence
                if tok in self.eos_ids:
                    emitted, emitted_lp = emitted[: j + 1], emitted_lp[: j + 1]
                    seq.done = True
                    break
            seq.steps.append(StepRecord(r, mode, self.target.gemm, accepted))
            seq.context.extend(emitted)
            seq.ids.extend(emitted)
            seq.logprobs.extend(emitted_lp)
            seq.drafter.accept(seq.context, accepted)
            results.append((d, emitted, emitted_lp, accepted))
        t3 = time.perf_counter()
        shadow_s = self.shadow_catch_up(seqs)
        for seq in seqs:
            seq.done = seq.done or len(seq.ids) >= max_new_tokens
        n = len(seqs)
        return [
            StepResult(d, e, lp, a, ds, (t2 - t1) / n, shadow_s / n, (t3 - t2) / n)
            for (d, e, lp, a), ds in zip(results, draft_s, strict=True)
        ]

    def _verify(
        self, seqs: list[Sequence], rows: list[list[int]], mode: Mode
    ) -> tuple[list[Tensor], graphs.CapturedForward | graphs.CapturedBatch | None]:
        """Every sequence's rows through the target: one sequence replays its graph (or runs
        eagerly, observed for fault tests); several replay their batch's graph, or run eagerly
        in one batched forward."""
        if len(seqs) == 1:
            seq = seqs[0]
            tokens = self._tensor(rows[0])
            observer = self.fault(len(seq.steps)) if self.fault else None
            graph = None if observer else self._graph(seq.state, len(rows[0]), mode)
            if graph is not None:
                return [graph.replay(tokens, seq.state)], graph
            # an observed forward is eager: the observer sees (and may change) every sub-op
            return [self.target.forward(tokens, seq.state, mode, observer)], None
        # sequences with as many rows side by side, so that they step together (`Rows.run`)
        order = sorted(range(len(seqs)), key=lambda j: len(rows[j]))
        lens = [len(rows[j]) for j in order]
        tokens = self._tensor([t for j in order for t in rows[j]])
        states = [seqs[j].state for j in order]
        graph = self._batch_graph(states, lens[0], mode) if lens[0] == lens[-1] else None
        if graph is not None:
            lp = graph.replay(tokens, states)
        else:
            lp = self.target.forward_batch(tokens, states, lens, mode)
        out = dict(zip(order, lp.split(lens), strict=True))
        return [out[j] for j in range(len(seqs))], graph

    def shadow_catch_up(self, seqs: Sequence | list[Sequence]) -> float:
        """Decode the shadows up to their speculative runs' lengths, one batched decode row per
        lagging sequence per forward, comparing as they go. A shadow runs to the end after a
        divergence too (its own greedy path), so a later change of the text is seen, and its
        time is always real."""
        seqs = [seqs] if isinstance(seqs, Sequence) else seqs
        t0 = time.perf_counter()
        while lag := [s for s in seqs if s.shadow is not None and len(s.shadow_ids) < len(s.ids)]:
            token = self._tensor([s.shadow_ids[-1] for s in lag])
            if len(lag) == 1:
                shadow = lag[0].shadow
                assert shadow is not None
                graph = self._graph(shadow, 1, "exact")
                if graph is not None:
                    lp = graph.replay(token, shadow)
                    graph.commit([shadow], [1])
                else:
                    lp = self.target.forward(token, shadow, "exact")
                    shadow.commit(1)
            else:
                states = [s.shadow for s in lag if s.shadow is not None]
                ones = [1] * len(states)
                batch = self._batch_graph(states, 1, "exact")
                if batch is not None:
                    lp = batch.replay(token, states)
                    batch.commit(states, ones)
                else:
                    lp = self.target.forward_batch(token, states, ones, "exact")
                    commit_batch(states, ones)
            toks, tok_lps = ops.greedy(lp)
            for i, (seq, tok, tok_lp) in enumerate(
                zip(lag, toks.tolist(), tok_lps.tolist(), strict=True)
            ):
                if self._compare(seq, tok, tok_lp):
                    seq.shadow_rows[len(seq.shadow_ids) - 1] = lp[i].clone()
        return time.perf_counter() - t0

    @staticmethod
    def _compare(seq: Sequence, tok: int, tok_lp: float) -> bool:
        """Append the shadow's token; True when the runs first diverge there (bits or text)."""
        seq.shadow_ids.append(tok)
        seq.shadow_logprobs.append(tok_lp)
        j = len(seq.shadow_ids) - 1
        same_id = seq.shadow_ids[j] == seq.ids[j]
        first = False
        if seq.text_diverged_at is None and not same_id:
            seq.text_diverged_at = j
            first = True
        if seq.diverged_at is None and not (
            same_id and same_fp32_bits(seq.shadow_logprobs[j], seq.logprobs[j])
        ):
            seq.diverged_at = j
            first = True
        return first

    def step_of(self, seq: Sequence, position: int) -> tuple[int, int]:
        """(verify step index, row within it) that emitted generated token `position`."""
        emitted = 1  # the prefill token
        for s, rec in enumerate(seq.steps):
            n = rec.accepted + 1
            if position < emitted + n:
                return s, position - emitted
            emitted += n
        raise ValueError(f"position {position} was not emitted by a verify step")
