"""The native engine on CUDA: Triton kernels + CUDA graphs keep speculation exact.

Skipped without a CUDA device (CI has none); run on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_models import plain_greedy

from specdash import ops
from specdash.drafters import ModelDrafter
from specdash.engine import Engine
from specdash.model import Model, random_tensors
from specdash.model_config import preset

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _model(seed: int, noise: float = 0.0) -> Model:
    # small, but inside the Triton kernels' shapes (pow2 head dims, Dv a multiple of 32)
    cfg = replace(
        preset("tiny-hybrid"),
        hidden_size=256,
        intermediate_size=512,
        head_dim=64,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
    )
    tensors = random_tensors(cfg, 0, torch.bfloat16, "cuda")
    if noise:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        tensors = {
            n: (
                t + noise * torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype) * t.std()
            )
            if t.dim() == 2
            else t
            for n, t in tensors.items()
        }
    return Model.from_tensors(
        cfg, tensors, ops.resolve_gemm_backend("triton", torch.device("cuda"))
    )


@pytest.mark.parametrize("k", [1, 4, 9])
def test_graphed_spec_equals_eager_plain_greedy(k: int) -> None:
    target, draft = _model(0), _model(1, noise=0.05)
    engine = Engine(target, lambda: ModelDrafter(draft), [])
    assert engine.cuda_graphs and target.triton_rows
    gen = torch.Generator().manual_seed(k)
    accepted = 0
    for i in range(6):
        prompt = torch.randint(0, target.cfg.vocab_size, (5 + 7 * i,), generator=gen).tolist()
        seq, _ = engine.start(i, prompt, 32, 16, shadow=True)
        while not seq.done:
            accepted += engine.spec_step(seq, k, "exact", 32).accepted
        ref_ids, ref_lps = plain_greedy(target, prompt, 32)
        assert seq.diverged_at is None
        assert torch.equal(torch.tensor(seq.ids), ref_ids)
        assert torch.equal(torch.tensor(seq.logprobs, dtype=torch.float32), ref_lps)
        engine.release(seq)
    assert accepted > 0


def test_graphed_fast_verify_equals_eager_fast_verify() -> None:
    """Fast mode is graphed too (for the exact/fast throughput ratio): a replay must compute
    what the eager forward computes, and the commit graphs must roll back the same way."""
    target, draft = _model(0), _model(1, noise=0.05)
    runs = []
    for graphs in (True, False):
        engine = Engine(target, lambda: ModelDrafter(draft), [])
        engine.cuda_graphs = graphs
        gen = torch.Generator().manual_seed(3)
        ids, lps = [], []
        for i in range(4):
            prompt = torch.randint(0, target.cfg.vocab_size, (9 + 5 * i,), generator=gen).tolist()
            seq, _ = engine.start(i, prompt, 24, 16, shadow=False)
            while not seq.done:
                engine.spec_step(seq, 4, "fast", 24)
            ids += seq.ids
            lps += seq.logprobs
            engine.release(seq)
        runs.append((ids, lps))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(torch.tensor(runs[0][1]), torch.tensor(runs[1][1]))
