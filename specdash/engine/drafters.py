"""Drafters propose up to k tokens; the target's verify decides. Both are rolled back to the
accepted prefix after every step, so a drafter never has to guess what was kept."""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch

from specdash.engine.model import Model
from specdash.engine.state import SeqState, take_fitting

Tensor = torch.Tensor


class Drafter(Protocol):
    name: str

    def start(self, prompt: list[int], capacity: int) -> None:
        """A new sequence: `prompt` is everything before the first generated token."""

    def propose(self, context: list[int], k: int) -> list[int]:
        """Up to k tokens to follow `context` (prompt + generated, last one not yet verified)."""

    def accept(self, context: list[int], accepted: int) -> None:
        """The target kept `accepted` of the last proposal; `context` now ends in the new token."""


class NgramDrafter:
    """Prompt lookup: continue the most recent earlier occurrence of the longest suffix n-gram."""

    name = "ngram"

    def __init__(self, max_n: int = 3) -> None:
        self.max_n = max_n

    def start(self, prompt: list[int], capacity: int) -> None:
        pass

    def propose(self, context: list[int], k: int) -> list[int]:
        for n in range(min(self.max_n, len(context) - 1), 0, -1):
            suffix = context[-n:]
            for s in range(len(context) - n - 1, -1, -1):
                if context[s : s + n] == suffix:
                    return context[s + n : s + n + k]
        return []

    def accept(self, context: list[int], accepted: int) -> None:
        pass


class ReplayDrafter:
    """Proposes a continuation known in advance (a previous plain run's tokens): with the
    target's own greedy output, every draft is accepted — speculation's best case."""

    name = "replay"

    def __init__(self, continuation: dict[tuple[int, ...], list[int]]) -> None:
        self.continuation = continuation
        self.prompt: tuple[int, ...] = ()

    def start(self, prompt: list[int], capacity: int) -> None:
        self.prompt = tuple(prompt)

    def propose(self, context: list[int], k: int) -> list[int]:
        done = len(context) - len(self.prompt)
        return self.continuation[self.prompt][done : done + k]

    def accept(self, context: list[int], accepted: int) -> None:
        pass


class RandomDrafter:
    """Uniform random tokens: almost never accepted — speculation's worst case."""

    name = "random"

    def __init__(self, vocab_size: int, seed: int = 7) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size

    def start(self, prompt: list[int], capacity: int) -> None:
        pass

    def propose(self, context: list[int], k: int) -> list[int]:
        return torch.randint(0, self.vocab_size, (k,), generator=self.gen).tolist()

    def accept(self, context: list[int], accepted: int) -> None:
        pass


CATCH_UP_BATCHED = 32
"""Catch-ups longer than this take the chunked prefill path; shorter ones one batched step."""


class ModelDrafter:
    """A small causal LM with the target's tokenizer, decoding greedily.

    Drafts need no exactness (the target's verify decides what is emitted), so the draft
    runs the `fast` forward: batched torch ops, a third of the exact path's dispatches.
    The draft state holds a prefix of the context. `propose` feeds what it has not seen
    (the last accepted draft, or everything decoded while speculation was off) together
    with the last token in its first forward, then runs single-token steps, remembering
    the state after each; GDN state tensors are replaced, never written in place, so a
    snapshot is a few references and rejecting drafts is restoring one.
    """

    name = "model"

    def __init__(self, model: Model) -> None:
        self.model = model
        self.state: SeqState | None = None
        self.c_step, self._free = _shared(model)
        """The compiled single-token step (`cpu_draft`) on the CPU, built once per draft model
        (it holds transposed weight copies); None: torch's `fast`. `_free`: released states of
        this model, reused by the next sequence (memory stays flat over mixed prompt lengths)."""
        self._snapshots: list[tuple[int, dict[int, tuple[Tensor, Tensor]]]] = []

    def _snapshot(self) -> tuple[int, dict[int, tuple[Tensor, Tensor]]]:
        assert self.state is not None
        return self.state.length, {i: (g.conv, g.ssm) for i, g in self.state.gdn.items()}

    def _restore(self, snap: tuple[int, dict[int, tuple[Tensor, Tensor]]]) -> None:
        assert self.state is not None
        self.state.rewind(snap[0])
        for i, (conv, ssm) in snap[1].items():
            self.state.gdn[i].conv, self.state.gdn[i].ssm = conv, ssm

    def _tensor(self, tokens: list[int]) -> Tensor:
        return torch.tensor(tokens, device=self.model.device)

    def start(self, prompt: list[int], capacity: int) -> None:
        m = self.model
        self.state = take_fitting(self._free, capacity)
        if self.state is None:
            if self._free:  # none fits: drop one, so the pool stays as large as the batch
                self._free.pop(0)
            self.state = SeqState.empty(m.cfg, capacity, m.dtype, m.device)
        m.forward(self._tensor(prompt), self.state, "prefill")

    def release(self) -> None:
        """The sequence is finished: its state (KV buffers) serves the next `start`."""
        if self.state is not None:
            self._free.append(self.state)
            self.state, self._snapshots = None, []

    def propose(self, context: list[int], k: int) -> list[int]:
        state = self.state
        assert state is not None and state.length <= len(context) - 1
        behind = context[state.length : -1]
        if len(behind) > CATCH_UP_BATCHED:  # e.g. after a long stretch with speculation off
            self.model.forward(self._tensor(behind), state, "prefill")
            behind = []
        self._snapshots, proposal = [], []
        if self.c_step is not None:
            for tok in behind:
                self.c_step.step(tok, state)
            tok = context[-1]
            for _ in range(k):
                tok = self.c_step.step(tok, state)
                self._snapshots.append(self._snapshot())
                proposal.append(tok)
            return proposal
        rows = [*behind, context[-1]]  # a short catch-up rides along with the first step
        for _ in range(k):
            lp = self.model.forward(self._tensor(rows), state, "fast")
            state.commit(len(rows))
            rows = [int(lp[-1].argmax())]
            self._snapshots.append(self._snapshot())
            proposal += rows
        return proposal

    def accept(self, context: list[int], accepted: int) -> None:
        """Keep the state after the accepted drafts (all kept: the last is fed next time)."""
        if accepted < len(self._snapshots):
            self._restore(self._snapshots[accepted])
        self._snapshots = []


_SHARED: weakref.WeakKeyDictionary[Model, tuple[object, list[SeqState]]] = (
    weakref.WeakKeyDictionary()
)


def _shared(model: Model) -> tuple[Any, list[SeqState]]:
    """Per draft model: its compiled step (or None) and the pool of released states."""
    if model not in _SHARED:
        from specdash.engine import cpu_draft

        step = cpu_draft.DraftStep(model) if cpu_draft.supported(model) else None
        _SHARED[model] = (step, [])
    return _SHARED[model]
