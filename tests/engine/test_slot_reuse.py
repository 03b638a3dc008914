"""`Engine.reserve` allocates the session's state slots once, sized for its longest prompt, and
every prompt reuses them, so RSS does not follow each prompt's KV. Reusing a slot across prompts
of different lengths changes no bit, and no slot buffer is reallocated."""

from __future__ import annotations

import pytest
import torch
from test_batch_exact import K_MAX, MAX_NEW, assert_same, decode, drafter_factory
from tiny_models import write_pair

from specdash.engine.drafters import _shared
from specdash.engine.engine import Engine
from specdash.engine.loader import Loaded, load_models
from specdash.engine.state import SeqState
from specdash.settings import SessionSettings


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    target, draft, _ = write_pair(tmp_path_factory.mktemp("tiny"))
    return load_models(SessionSettings(model=target, draft=draft))


def buffers(states: list[SeqState]) -> list[int]:
    ptrs = []
    for s in states:
        ptrs += [t.data_ptr() for c in s.kv.values() for t in (c.k, c.v)]
        ptrs += [t.data_ptr() for g in s.gdn.values() for t in (g.conv, g.ssm)]
    return ptrs


@pytest.mark.parametrize("batch", [1, 3])
def test_reserved_slots_are_reused_and_change_no_bit(loaded: Loaded, batch: int) -> None:
    gen = torch.Generator().manual_seed(5)
    vocab = loaded.target.cfg.vocab_size
    lengths = [70, 4, 33, 2, 51, 9, 70, 17]  # long first, then short ones on the same slots
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    fresh = decode(Engine(loaded.target, drafter_factory(loaded, "model"), []), prompts, batch, 3)

    engine = Engine(loaded.target, drafter_factory(loaded, "model"), [])
    engine.reserve(max(lengths), MAX_NEW, K_MAX, sequences=batch, shadow=True)
    slots = list(engine._slots)
    assert len(slots) == 2 * batch and all(s.capacity == engine.slot_capacity for s in slots)
    before = buffers(slots)
    reused = decode(engine, prompts, batch, 3)

    assert_same(fresh, reused)
    assert all(s.diverged_at is None for s in reused.values())
    assert len(engine._slots) == len(slots) and all(map(lambda a, b: a is b, engine._slots, slots))
    assert buffers(slots) == before  # no slot (re)allocated
    assert loaded.draft is not None
    draft_pool = _shared(loaded.draft)[1]
    assert len(draft_pool) <= batch + 1  # released draft states, bounded by what was in flight
