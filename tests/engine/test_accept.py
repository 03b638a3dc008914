"""The greedy accept rule: how many drafts a verify step accepts and which tokens it emits,
end-of-text included (an accepted count past an end-of-text would inflate the acceptance
rate)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import plain_greedy, tiny_config

from specdash.engine.drafters import ReplayDrafter
from specdash.engine.engine import Engine, accept
from specdash.engine.model import Model, random_tensors

K = 5


@pytest.fixture(scope="module")
def target() -> Model:
    cfg = tiny_config(vocab_size=320)
    return Model.from_tensors(cfg, random_tensors(cfg, 0))


@pytest.fixture(scope="module")
def greedy(target: Model) -> tuple[list[int], list[int]]:
    """A prompt and its first 12 greedy tokens, the first k + 2 all different (so each ends
    the first verify step where it stands when it is the end-of-text)."""
    prompt = torch.randint(0, 320, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    ids = plain_greedy(target, prompt, 12)[0].tolist()
    assert len(set(ids[: K + 2])) == K + 2
    return prompt, ids


@pytest.mark.parametrize("eos_at", range(1, K + 2))
def test_a_drafted_end_of_text_ends_the_step_and_its_accepted_count(
    target: Model, greedy: tuple[list[int], list[int]], eos_at: int
) -> None:
    """The drafter proposes the target's own greedy tokens, so all k drafts match; greedy token
    `eos_at` is the end-of-text. The first verify step checks drafts ids[1..k]: an end-of-text
    among them is accepted and ends the step there, with no bonus and none of the drafts after
    it accepted; at k + 1 it is the bonus token, after all k drafts."""
    prompt, ids = greedy
    engine = Engine(target, lambda: ReplayDrafter({tuple(prompt): ids}), [ids[eos_at]])
    seq, _ = engine.start(0, prompt, len(ids), K, shadow=True)
    (step,) = engine.spec_step([seq], K, "exact", len(ids))
    assert step.drafts == ids[1 : K + 1]
    assert step.emitted == ids[1 : eos_at + 1] and seq.done
    assert step.accepted == min(eos_at, K)
    assert seq.ids == ids[: eos_at + 1] and seq.diverged_at is None


@pytest.mark.parametrize(
    ("drafts", "target", "eos", "verdict"),
    [
        ([], [7], set(), (0, 1)),  # a plain decode step: the bonus token only
        ([1, 2, 3], [1, 2, 3, 4], set(), (3, 4)),  # every draft, and the bonus
        ([1, 2, 3], [1, 9, 3, 4], set(), (1, 2)),  # d_3 == t_3 after a mismatch does not count
        ([1, 2, 3], [5, 2, 3, 4], set(), (0, 1)),
        ([1, 2, 3], [1, 2, 3, 4], {2}, (2, 2)),  # a drafted end-of-text: no bonus, none after
        ([1, 2, 3], [1, 2, 3, 4], {3}, (3, 3)),
        ([1, 2, 3], [1, 2, 3, 4], {4}, (3, 4)),  # the bonus is the end-of-text
        ([1, 2, 3], [1, 9, 3, 4], {9}, (1, 2)),  # so is the rejected draft's replacement
        ([1, 2, 3], [1, 2, 3, 4], {3, 1}, (1, 1)),  # the first end-of-text ends the step
    ],
)
def test_accept_counts_the_drafts_before_the_first_mismatch_and_end_of_text(
    drafts: list[int], target: list[int], eos: set[int], verdict: tuple[int, int]
) -> None:
    """(accepted drafts, emitted tokens)."""
    assert accept(drafts, target, eos) == verdict
