"""The root cause of a divergence in a batched run names the sub-op that actually ran.

Fast verify with the n-gram drafter, k = 7, batch 8, prompts of mixed lengths (short ones with
long ones between them, which change each step's GEMM M and row layout): every forward the run
makes is recorded live here, and the expected cause of each flagged token is computed from
those recorded batched rows against plain decode rows (`Model.forward`, one row at a time), not
from any replay. The root cause must name that layer, sub-op and token and say that its replay
reproduced the flagged bits; a replay that cannot reproduce them must say so and name nothing.

How a CPU GEMM's row bits depend on M and the layout is the CPU's business (with MKL on
AVX-512 one row takes another path than two or more), so besides torch's real GEMM the run also
takes one that gives a call's first row decode's exact bits and its other rows another
computation's: a sequence replayed alone, or its batch laid out in another order, then differs
from the forward that ran on every CPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tiny_models import CORPUS, PROMPTS, write_pair

from specdash.engine.drafters import NgramDrafter
from specdash.engine.engine import Engine, Sequence
from specdash.engine.loader import load_models
from specdash.engine.model import Model
from specdash.engine.root_cause import RootCauseFinder
from specdash.engine.state import SeqState
from specdash.events import Divergence, Event, RootCause
from specdash.kernels.gemm_backends import GemmBackend
from specdash.prompts import load_prompts
from specdash.runs.native import NativeBackend, native_session
from specdash.runs.session import Session
from specdash.settings import SessionSettings

MAX_NEW = 12
Records = list[tuple[int, str, torch.Tensor]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The tiny pair and 12 prompts: the short ones with ~1k- and ~2k-token ones between them."""
    target, draft, _ = write_pair(tmp_path_factory.mktemp("tiny"))
    text = "".join(CORPUS)
    long = [text * 5, text * 10, (text * 6)[7:], (text * 11)[3:]]
    mixed = [PROMPTS[0], long[0], PROMPTS[1], PROMPTS[2], long[1], PROMPTS[3]]
    mixed += [PROMPTS[4], long[2], PROMPTS[5], PROMPTS[6], long[3], PROMPTS[7]]
    prompts = target.parent / "mixed.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in mixed))
    return target, draft, prompts


def first_row_exact(backend: GemmBackend) -> GemmBackend:
    """A call's first row with decode's exact bits, its other rows through an fp64-accumulated
    GEMM: a row's bits depend on where it sits in the call (as BLAS kernels treat a block's
    edge rows apart), so a replay must lay every row out as the run did."""
    exact = backend.fn
    assert exact is not None

    def gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = (x.double() @ w.double().T).to(x.dtype)
        out[:1] = exact(x[:1], w)
        return out

    return dataclasses.replace(backend, name="first-row-exact", fast_fn=gemm)


def nondeterministic(backend: GemmBackend) -> GemmBackend:
    """torch's GEMM with fresh relative noise of ~1e-5 at every call (a GPU's split-K GEMM with
    atomics reorders its sums from run to run, only less): no replay gives the bits that ran."""
    fast = backend.fast_fn or backend.fn
    assert fast is not None
    gen = torch.Generator().manual_seed(0)

    def gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = fast(x, w)
        return out + out.abs() * 1e-5 * torch.randn(out.shape, generator=gen)

    return dataclasses.replace(backend, name="nondeterministic", fast_fn=gemm)


class LiveForwards:
    """Every fast forward the run makes, as it ran: each sequence's rows of it and their
    sub-op outputs. Forwards on states the engine did not start (a root cause's replay) are
    left out. An observer that returns its input changes nothing the fast rows compute."""

    def __init__(self, engine: Engine) -> None:
        self.seqs: list[Sequence] = []
        self.rows: dict[int, list[Records]] = {}  # prompt index -> its sub-ops per step
        self._owner: dict[int, Sequence] = {}  # a state slot -> the sequence holding it now
        model = engine.target
        start, forward_pass = engine.start, model._forward_pass

        def started(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            seq, seconds = start(*args, **kwargs)
            self.seqs.append(seq)
            self._owner[id(seq.state)] = seq
            return seq, seconds

        def observed(tokens, state, mode, observe=None, all_logits=False, lens=None, run=None):  # noqa: ANN001, ANN202
            states = state if isinstance(state, list) else [state]
            if mode != "fast" or any(id(st) not in self._owner for st in states):
                return forward_pass(tokens, state, mode, observe, all_logits, lens, run)
            records: Records = []
            out = forward_pass(tokens, state, mode, recorder(records), all_logits, lens, run)
            offset = 0
            for st, n in zip(states, lens or [tokens.shape[0]], strict=True):
                part = [(layer, name, x[offset : offset + n]) for layer, name, x in records]
                self.rows.setdefault(self._owner[id(st)].index, []).append(part)
                offset += n
            return out

        engine.start = started  # type: ignore[method-assign]
        model._forward_pass = observed  # type: ignore[method-assign]


def recorder(records: Records) -> Callable[[int, str, torch.Tensor], torch.Tensor]:
    """An observer that keeps a copy of every sub-op's output and changes nothing."""

    def record(layer: int, name: str, x: torch.Tensor) -> torch.Tensor:
        records.append((layer, name, x.clone()))
        return x

    return record


def decode_rows(model: Model, prompt: list[int], ids: list[int]) -> list[Records]:
    """Plain greedy decode's sub-ops for generated tokens 1..len(ids)-1 (row p is fed token
    p - 1 of `ids` and predicts token p); entry 0 is the prefill's, left empty."""
    state = SeqState.empty(model.cfg, len(prompt) + len(ids) + 1, model.dtype, model.device)
    out: list[Records] = [[]]
    with torch.inference_mode():
        model.forward(torch.tensor(prompt), state, "prefill")
        for tok in ids[:-1]:
            records: Records = []
            model.forward(torch.tensor([tok]), state, "exact", recorder(records))
            state.commit(1)
            out.append(records)
    return out


def check_cause(
    model: Model, live: LiveForwards, seq: Sequence, position: int, cause: RootCause
) -> None:
    """`cause` says its replay reproduced the flagged bits and names the first difference
    between the rows that ran (`live`) and plain decode's: the earliest step with one, then
    forward order, then the earliest row, over the rows up to token `position`; embedding and
    head with no layer (None), as `RootCause` says."""
    assert cause.reproduced is True, (seq.index, cause.detail)
    decode = decode_rows(model, seq.prompt, seq.ids[: position + 1])
    first = 1  # the token a step's row 0 predicts
    want = None
    for records, rec in zip(live.rows[seq.index], seq.steps, strict=False):
        kept = min(rec.accepted + 1, position - first + 1)
        if first + kept > position:  # the flagged step: its rows that ran gave the bits
            lp = next(x for _, name, x in records if name == "log_softmax")[position - first]
            got = (int(lp.argmax()), lp.max().item())
            assert got == (seq.ids[position], seq.logprobs[position])
        differ = [
            (i, r)
            for i, (_, _, x) in enumerate(records)
            for r in range(kept)
            if not torch.equal(x[r : r + 1], decode[first + r][i][2])
        ]
        if want is None and differ:
            layer, name, _ = records[differ[0][0]]
            inside = 0 <= layer < model.cfg.num_hidden_layers
            want = (layer if inside else None), name, first + differ[0][1]
        first += kept
        if first > position:
            break
    assert (cause.layer, cause.sub_op, cause.origin_position) == want, (seq.index, cause.detail)


def run_batch(
    pair: tuple[Path, Path, Path], gemm: Callable[[GemmBackend], GemmBackend] | None
) -> tuple[list[Event], Session, LiveForwards]:
    target, _, prompts = pair
    settings = SessionSettings(
        model=target,
        prompts=prompts,
        drafter="ngram",
        k=7,
        batch=8,
        verify_mode="fast",
        max_new_tokens=MAX_NEW,
    )
    events: list[Event] = []
    session = native_session(settings, events.append)
    backend = session.backend
    assert isinstance(backend, NativeBackend)
    if gemm is not None:
        backend.loaded.target.gemm = gemm(backend.loaded.target.gemm)
    live = LiveForwards(backend.engine)
    session.run()
    return events, session, live


@pytest.mark.parametrize("gemm", [None, first_row_exact], ids=["torch", "first-row-exact"])
def test_batched_root_cause_names_the_op_that_ran(pair, gemm) -> None:  # noqa: ANN001
    events, session, live = run_batch(pair, gemm)
    assert isinstance(session.backend, NativeBackend)
    flagged = [e for e in events if isinstance(e, Divergence) and e.root_cause is not None]
    assert len(flagged) >= 8, "fast verify at batch 8 flagged too few prompts to test"
    for d in flagged:
        seq = next(s for s in live.seqs if s.index == d.prompt_index)
        assert d.root_cause is not None
        check_cause(session.backend.engine.target, live, seq, d.position, d.root_cause)
        end = len(seq.prompt) + d.position  # the context: the 24 tokens before it
        tok = session.backend.loaded.tokenizer
        assert d.context == tok.decode([*seq.prompt, *seq.ids][max(0, end - 24) : end])


def test_continuous_batching_root_cause_names_the_op_that_ran(pair) -> None:  # noqa: ANN001
    """Sequences join a running batch (the engine's continuous batching): a step's batch holds
    sequences at different steps of their own, and the replay brings each to its state there,
    through forwards the flagged sequence was not in."""
    loaded = load_models(SessionSettings(model=pair[0], drafter="ngram"))
    loaded.target.gemm = first_row_exact(loaded.target.gemm)
    engine = Engine(loaded.target, NgramDrafter, loaded.eos_ids)
    live = LiveForwards(engine)
    queue = [loaded.tokenizer.encode(p.text) for p in load_prompts(pair[2])]
    flight: list[Sequence] = []
    widest = 0
    with torch.inference_mode():
        for step in itertools.count():
            if queue and step % 2 == 0:  # one more every other step, whoever is in flight
                flight.append(engine.start(len(live.seqs), queue.pop(0), MAX_NEW, 7, True)[0])
            flight = [s for s in flight if not s.done]
            if not flight and not queue:
                break
            if flight:
                widest = max(widest, len(flight))
                engine.spec_step(flight, 7, "fast", MAX_NEW)
    assert widest >= 3, "no sequence joined a running batch"
    finder = RootCauseFinder(engine)
    flagged = [s for s in live.seqs if s.diverged_at is not None]
    assert len(flagged) >= 8
    for seq in flagged:
        assert seq.diverged_at is not None
        check_cause(engine.target, live, seq, seq.diverged_at, finder.find(seq, seq.diverged_at))


@pytest.fixture(scope="module")
def unreproducible(pair: tuple[Path, Path, Path]) -> tuple[list[Event], Session]:
    events, session, _ = run_batch(pair, nondeterministic)
    return events, session


def test_a_replay_that_cannot_reproduce_the_bits_says_so(unreproducible) -> None:  # noqa: ANN001
    events, session = unreproducible
    flagged = [e for e in events if isinstance(e, Divergence) and e.root_cause is not None]
    assert flagged
    for d in flagged:
        rc = d.root_cause
        assert rc is not None and rc.reproduced is False, rc
        assert (rc.layer, rc.sub_op) == (None, "none")
        assert rc.detail.startswith("NOT REPRODUCED") and f"token {d.position}" in rc.detail
    assert session.stats.summary().unreproduced_root_causes == len(flagged)


async def test_the_dashboard_shows_a_root_cause_not_reproduced(unreproducible) -> None:  # noqa: ANN001
    """The divergence table says "not reproduced" where a cause would stand, and the detail
    (Enter) says what the replay gave."""
    from fake_events import ScriptedSource
    from textual.widgets import DataTable, Static

    from specdash.ui.app import SpecdashApp
    from specdash.ui.widgets.divergence import DivergenceDetail

    app = SpecdashApp(ScriptedSource.live_like(unreproducible[0]))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        await pilot.pause()
        table = app.query_one("#divergence-table", DataTable)
        assert table.row_count and "not reproduced" in [str(c) for c in table.get_row_at(0)]
        table.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, DivergenceDetail)
        shown = str(app.screen.query_one(Static).render())
        assert "root cause not reproduced" in shown and "NOT REPRODUCED: replaying" in shown
