"""At each divergence, the shadow's own top-1 / top-2 gap at that position: a flip across a
gap of a few ulps is rounding, one across a wide gap is a broken kernel. Checked against the
row recomputed straight from `Model.forward`, and shown in every view."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch

from specdash.engine.state import SeqState
from specdash.events import Divergence, Event, Margin, PromptStart, Token
from specdash.metrics import fp32_ulps
from specdash.runs.native import native_session
from specdash.runs.session import Session
from specdash.settings import SessionSettings


def test_fp32_ulps_counts_representable_values_between():
    one = 1.0
    (bits,) = struct.unpack("<I", struct.pack("<f", one))
    (next_up,) = struct.unpack("<f", struct.pack("<I", bits + 3))
    assert fp32_ulps(one, next_up) == 3 == fp32_ulps(next_up, one)
    assert fp32_ulps(0.0, -0.0) == 0
    # across zero, with the smallest normal value: a denormal would read as zero wherever a
    # library has set flush-to-zero for the process (the CPU engine's tests do)
    smallest = 2.0**-126
    assert fp32_ulps(smallest, -smallest) == 2 * 0x00800000


def test_margin_judges_ties_by_the_compute_dtype():
    a, b = -0.6931471824645996, -0.6931472420692444  # 1 fp32 ulp apart
    assert Margin.between((5, a), (7, b), "float32").near_tie
    wide = Margin.between((5, -0.1), (7, -2.5), "float32")
    assert not wide.near_tie and wide.gap == pytest.approx(2.4)
    # 0.01 nats is thousands of fp32 ulps, but within bf16's rounding of a logit
    assert not Margin.between((5, -0.50), (7, -0.51), "float32").near_tie
    assert Margin.between((5, -0.50), (7, -0.51), "bfloat16").near_tie


@pytest.fixture(scope="module")
def fast_session(pair):
    settings = SessionSettings(model=pair[0], draft=pair[1], prompts=pair[2], max_new_tokens=8,
                               k=4, verify_mode="fast")  # fmt: skip
    events: list[Event] = []
    runner = native_session(settings, events.append)
    runner.run()
    return runner, events


def _shadow_row(runner: Session, prompt: list[int], before: list[int]) -> torch.Tensor:
    """The plain greedy row that predicts generated token len(before), from Model.forward."""
    m = runner.backend.loaded.target
    state = SeqState.empty(m.cfg, len(prompt) + len(before) + 2, m.dtype, m.device)
    with torch.inference_mode():
        row = m.forward(torch.tensor(prompt), state, "prefill")[-1]
        for tok in before:
            row = m.forward(torch.tensor([tok]), state, "exact")[-1]
            state.commit(1)
    return row


def test_native_divergences_carry_the_shadows_margin(fast_session):
    runner, events = fast_session
    divergences = [e for e in events if isinstance(e, Divergence)]
    assert divergences, "fast verify on the tiny pair diverges"
    texts = {e.prompt_index: e.text for e in events if isinstance(e, PromptStart)}
    for d in divergences:
        m = d.shadow_margin
        assert isinstance(m, Margin) and m.top1_token == d.shadow_token
        tokens = sorted(
            (e for e in events if isinstance(e, Token) and e.prompt_index == d.prompt_index),
            key=lambda e: e.position,
        )
        before = [t.token_id for t in tokens[: d.position]]  # the ids agree before it
        prompt = runner.backend.loaded.tokenizer.encode(texts[d.prompt_index])
        values, ids = _shadow_row(runner, prompt, before).topk(2)
        assert [m.top1_token, m.top2_token] == ids.tolist()
        assert m.gap == values[0].item() - values[1].item()
        assert m.ulps == fp32_ulps(values[0].item(), values[1].item())
        if d.what == "token":
            assert m.top2_token == d.spec_token or not m.near_tie


def test_margin_in_json_and_the_detail_screen(fast_session):
    from specdash.cli.headless import divergence_record
    from specdash.ui.widgets.divergence import margin_text

    _, events = fast_session
    d = next(e for e in events if isinstance(e, Divergence))
    record = json.loads(json.dumps(divergence_record(d)))
    assert record["shadow_margin"]["ulps"] == d.shadow_margin.ulps
    assert not math.isnan(record["shadow_margin"]["gap"])
    text = margin_text(d)
    assert "ulp" in text and ("near-tie" in text or "wide" in text)
    assert margin_text(d.model_copy(update={"shadow_margin": None})).startswith("not known")
