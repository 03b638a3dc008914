"""The native engine with block-FP8 weights on CUDA (the FP8 tile, CUDA graphs): speculation equals
the lockstep shadow and plain greedy decoding, bit for bit, at every batch size.

Skipped without a CUDA device (CI has none); run on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

import pytest
import torch
from test_batch_exact import MAX_NEW, decode, runs_by_batch, spoiled_replay
from tiny_models import kernel_sized, plain_greedy

from specdash.engine.drafters import ModelDrafter, RandomDrafter
from specdash.engine.engine import Engine
from specdash.engine.model import Model
from specdash.kernels import gemm_backends
from specdash.kernels.fp8 import Fp8Weight

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
        reason="needs a CUDA GPU with FP8 (compute capability 8.9+)",
    ),
]


def _fp8_model(seed: int) -> Model:
    """A small block-FP8 model inside the kernels' shapes."""
    cfg = kernel_sized("tiny-hybrid-fp8")
    dev = torch.device("cuda")
    return Model.random(cfg, seed, torch.bfloat16, dev, gemm_backends.resolve("triton-fp8", dev))


@pytest.mark.parametrize("k", [1, 4])
def test_graphed_fp8_spec_equals_eager_plain_greedy(k: int) -> None:
    target, draft = _fp8_model(0), _fp8_model(1)
    assert isinstance(target.layers[0].gate_up, Fp8Weight) and target.has_fp8
    engine = Engine(target, lambda: ModelDrafter(draft), [])
    assert engine.cuda_graphs
    gen = torch.Generator().manual_seed(k)
    for i in range(4):
        prompt = torch.randint(0, target.cfg.vocab_size, (5 + 7 * i,), generator=gen).tolist()
        seq, _ = engine.start(i, prompt, 24, 16, shadow=True)
        while not seq.done:
            engine.spec_step([seq], k, "exact", 24)
        ref_ids, ref_lps = plain_greedy(target, prompt, 24)
        assert seq.diverged_at is None
        assert torch.equal(torch.tensor(seq.ids), ref_ids)
        assert torch.equal(torch.tensor(seq.logprobs, dtype=torch.float32), ref_lps)
        engine.release(seq)
    assert {key[2:] for key in engine._graphs} == {("triton-fp8", "exact")}


@pytest.mark.parametrize("k", [0, 3])
def test_fp8_batches_equal_one_at_a_time(k: int) -> None:
    """B = 1, 8 and 32 sequences per forward (graphed, and B = 32 eagerly too): every
    sequence's ids and fp32 logprob bits equal, no shadow diverges, and they are plain greedy
    decoding's. k = 3: the drafts replay the plain output, spoiled on odd prompts."""
    target = _fp8_model(0)
    vocab = target.cfg.vocab_size
    gen = torch.Generator().manual_seed(13)
    prompts = [torch.randint(0, vocab, (4 + 3 * i,), generator=gen).tolist() for i in range(32)]
    make = lambda: RandomDrafter(vocab)  # noqa: E731
    if k:
        make = spoiled_replay(decode(Engine(target, make, []), prompts, 32, 0), prompts, vocab)
    runs = runs_by_batch(target, make, prompts, k)
    for i in (0, 7):
        ids, lps = plain_greedy(target, prompts[i], MAX_NEW)
        assert runs[8, True][i].ids == ids.tolist()
        assert torch.equal(torch.tensor(runs[8, True][i].logprobs, dtype=torch.float32), lps)
