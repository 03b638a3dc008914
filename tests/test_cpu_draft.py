"""The compiled draft step (specdash.engine.cpu_draft) computes the draft model's torch `fast`
step: same logits to float tolerance, same state afterwards, same greedy proposals."""

from __future__ import annotations

import pytest
import torch

from specdash.engine import cpu_draft
from specdash.engine.checkpoint import load_checkpoint
from specdash.engine.drafters import ModelDrafter
from specdash.engine.loader import default_checkpoint
from specdash.engine.model import Model
from specdash.engine.state import SeqState

pytestmark = pytest.mark.skipif(
    cpu_draft.load() is None, reason=f"no compiled draft step: {cpu_draft.unavailable}"
)


@pytest.fixture(scope="module")
def draft() -> Model:
    cfg, tensors, _ = load_checkpoint(default_checkpoint("draft"), torch.float32, "cpu")
    return Model.from_tensors(cfg, tensors)


def test_c_step_matches_the_torch_fast_step(draft: Model) -> None:
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, draft.cfg.vocab_size, (300,), generator=gen)
    ref, got = (SeqState.empty(draft.cfg, 400, draft.dtype, draft.device) for _ in range(2))
    draft.forward(prompt, ref, "prefill")
    draft.forward(prompt, got, "prefill")
    step = cpu_draft.DraftStep(draft)
    tok_ref = 7
    agree = 0
    for _ in range(40):
        lp = draft.forward(torch.tensor([tok_ref]), ref, "fast")
        ref.commit(1)
        c_tok = step.step(tok_ref, got)  # both fed the reference token
        assert got.length == ref.length
        torch.testing.assert_close(torch.log_softmax(step.logits, -1), lp[0], atol=2e-4, rtol=1e-4)
        tok_ref = int(lp[0].argmax())
        agree += c_tok == tok_ref
    assert agree >= 39
    for i, g in got.gdn.items():
        torch.testing.assert_close(g.ssm, ref.gdn[i].ssm, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(g.conv, ref.gdn[i].conv)


def test_drafter_proposals_match_the_torch_drafter(draft: Model) -> None:
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(1, draft.cfg.vocab_size, (200,), generator=gen).tolist()
    c, t = ModelDrafter(draft), ModelDrafter(draft)
    t.c_step = None
    assert c.c_step is not None
    for d in (c, t):
        d.start(prompt, 400)
    context = [*prompt, 11]
    same = total = 0
    for accepted in (4, 0, 2, 1, 4, 3):
        pc, pt = c.propose(context, 4), t.propose(context, 4)
        same += pc == pt
        total += 1
        keep = pt[:accepted]
        context += [*keep, 13 + accepted]
        c.accept(context, accepted)
        t.accept(context, accepted)
        assert c.state.length == t.state.length
    assert same >= total - 1
