"""A long prompt is prefilled in chunks (bounded activation memory): later chunks attend to the
cached keys before them and continue the GDN state, so the model computes the same function.
Prefill is shared by the speculative run and its shadow, so exactness is unaffected."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_config

from specdash.engine import model as model_module
from specdash.engine.drafters import ModelDrafter
from specdash.engine.engine import Engine
from specdash.engine.model import Model, random_tensors
from specdash.engine.state import SeqState
from specdash.kernels import gemm_backends


def _model(seed: int) -> Model:
    cfg = tiny_config(vocab_size=320)
    return Model.from_tensors(
        cfg, random_tensors(cfg, seed), gemm_backends.resolve("torch", torch.device("cpu"))
    )


def _prefill(m: Model, prompt: list[int]) -> tuple[torch.Tensor, SeqState]:
    state = SeqState.empty(m.cfg, len(prompt) + 8, m.dtype, m.device)
    with torch.inference_mode():
        lp = m.forward(torch.tensor(prompt), state, "prefill", all_logits=True)
    return lp, state


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_prefill_computes_the_unchunked_function(monkeypatch, chunk: int) -> None:
    m = _model(0)
    prompt = torch.randint(0, 320, (45,), generator=torch.Generator().manual_seed(chunk)).tolist()
    whole, whole_state = _prefill(m, prompt)
    monkeypatch.setattr(model_module, "PREFILL_CHUNK", chunk)
    chunked, chunked_state = _prefill(m, prompt)
    assert chunked_state.length == whole_state.length == len(prompt)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=2e-4)
    assert torch.equal(chunked.argmax(-1), whole.argmax(-1))
    for i in whole_state.kv:
        torch.testing.assert_close(chunked_state.kv[i].k, whole_state.kv[i].k, rtol=0, atol=1e-4)
    for i in whole_state.gdn:
        a, b = chunked_state.gdn[i], whole_state.gdn[i]
        torch.testing.assert_close(a.ssm, b.ssm, rtol=0, atol=1e-4)
        torch.testing.assert_close(a.conv, b.conv, rtol=0, atol=1e-4)


def test_spec_after_chunked_prefill_equals_its_shadow(monkeypatch) -> None:
    monkeypatch.setattr(model_module, "PREFILL_CHUNK", 8)
    target, draft = _model(0), _model(1)
    engine = Engine(target, lambda: ModelDrafter(draft), [])
    gen = torch.Generator().manual_seed(2)
    for i in range(4):
        prompt = torch.randint(0, 320, (20 + 9 * i,), generator=gen).tolist()
        seq, _ = engine.start(i, prompt, 24, 16, shadow=True)
        with torch.inference_mode():
            while not seq.done:
                engine.spec_step([seq], 4, "exact", 24)
        assert seq.diverged_at is None and seq.compared == len(seq.ids) == 24
        engine.release(seq)


def test_a_prefilled_state_keeps_no_chunk_buffer_alive() -> None:
    """After prefill each GDN layer's conv window and state own their storage: a view into the
    chunk's conv sequence (T + 3 rows) would pin that buffer per layer (16 GB at a 16k chunk of
    the 27B shape: an 80 GB H100 then runs out of memory at 128k)."""
    m = _model(0)
    _, state = _prefill(m, list(range(40)))
    assert state.gdn
    for g in state.gdn.values():
        for t in (g.conv, g.ssm):
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
