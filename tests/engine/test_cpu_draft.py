"""The compiled draft step (specdash.engine.cpu_draft) computes the draft model's torch `fast`
step: same logits to float tolerance, same state afterwards, same greedy proposals; its RoPE
the same bits as the torch step's, for odd rotary dims too (head_dim 12 x 0.25 = 3)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdash.engine import cpu_draft, ops
from specdash.engine.checkpoint import load_checkpoint
from specdash.engine.config import preset
from specdash.engine.drafters import ModelDrafter
from specdash.engine.loader import default_checkpoint
from specdash.engine.model import Model
from specdash.engine.rows.rope import Rope
from specdash.engine.state import SeqState

pytestmark = pytest.mark.skipif(
    cpu_draft.load() is None, reason=f"no compiled draft step: {cpu_draft.unavailable}"
)


@pytest.fixture(scope="module")
def draft() -> Model:
    cfg, tensors, _ = load_checkpoint(default_checkpoint("draft"), torch.float32, "cpu")
    return Model.from_tensors(cfg, tensors)


def odd_rotary_model(head_dim: int, partial: float) -> Model:
    """A Qwen3.5-style hybrid whose attention rotates `head_dim * partial` dims."""
    cfg = replace(
        preset("tiny-hybrid"),
        head_dim=head_dim,
        partial_rotary_factor=partial,
        max_position_embeddings=512,
        layer_types=list(preset("tiny-hybrid").layer_types),
    )
    return Model.random(cfg, 0, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize(
    "head_dim,partial", [(12, 0.25), (12, 0.5), (12, 1.0), (32, 0.25), (10, 0.5), (16, 0.25)]
)
def test_rope_is_the_torch_steps_bit_for_bit(head_dim: int, partial: float) -> None:
    """Rotary dims 3, 6, 12, 8, 5 and 4: every head of a row, at several positions."""
    cfg = replace(preset("tiny-hybrid"), head_dim=head_dim, partial_rotary_factor=partial)
    rope = Rope.build(cfg, torch.float32, torch.device("cpu"))
    lib = cpu_draft.load()
    gen = torch.Generator().manual_seed(head_dim)
    heads = 5
    for pos in (0, 1, 77, 4000):
        x = torch.randn(heads, head_dim, generator=gen) * 3
        want = ops.apply_rope(x[None], rope.cos[pos : pos + 1], rope.sin[pos : pos + 1])[0]
        got = x.clone()
        lib.draft_rope(
            got.data_ptr(), head_dim, heads, rope.cos[pos].data_ptr(), rope.sin[pos].data_ptr(),
            rope.cos.shape[-1],
        )  # fmt: skip
        assert torch.equal(got, want), (cfg.rotary_dim, pos)


def test_c_step_with_an_odd_rotary_dim_matches_the_torch_fast_step() -> None:
    model = odd_rotary_model(12, 0.25)
    assert model.cfg.rotary_dim == 3
    test_c_step_matches_the_torch_fast_step(model)


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
