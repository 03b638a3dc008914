"""Real SGLang on a GPU, through the product's own session (`run_engine`): patched
speculative output equals the shadow bit for bit (ids and fp32 logprobs), stock SGLang does not
(each divergence with the shadow's top-1 / top-2 margin), and acceptance per verify step arrives
live. Skipped without CUDA and an importable SGLang;
run on the H200 by `benchmarks/sglang_gpu_run.sh` (STEPS=tests), which sets
SPECDASH_SGLANG_TEST_ARGS to the engine settings the carried SGLang supports there.

The pair is `benchmarks/sglang_checkpoint.py`'s: Qwen3.5 head dims, a dense Qwen3 draft with
real acceptance, so verify steps commit several rows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.sglang_gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs SGLang"),
]

from specdash.events import Divergence, Event, PromptDone, VerifyStep  # noqa: E402
from specdash.runs.runner import run_engine  # noqa: E402
from specdash.runs.sglang.args import SGLangOptions  # noqa: E402
from specdash.settings import SessionSettings  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROMPTS = 8
MAX_NEW = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from sglang_checkpoint import build

    from specdash.prompts import default_prompts_path

    out = tmp_path_factory.mktemp("sglang_pair")
    target, draft = build(out, "cuda")
    prompts = out / "prompts.jsonl"
    lines = default_prompts_path().read_text().splitlines()[:PROMPTS]
    prompts.write_text("\n".join(lines) + "\n")
    return target, draft, prompts


def session(pair, algorithm: str, *, unpatch: tuple[str, ...] = (), **engine_args) -> list[Event]:
    target, draft, prompts = pair
    events: list[Event] = []
    box = json.loads(os.environ.get("SPECDASH_SGLANG_TEST_ARGS", "{}"))
    settings = SessionSettings(
        engine="sglang",
        model=target,
        draft=draft if algorithm == "STANDALONE" else None,
        k=3,
        prompts=prompts,
        max_new_tokens=MAX_NEW,
    )
    options = SGLangOptions(
        speculative_algorithm=algorithm, engine_args={**box, **engine_args}, unpatch=unpatch
    )
    run_engine(settings, events.append, options=options)
    return events


# NGRAM eager and k in {1, 5} are benchmarks/bench_sglang.py's matrix (device time is short).
# STANDALONE with graphs: its draft graph capture imports DSA attention, which needs
# lazy_dsa_import on the carried SGLang (no deep_gemm).
@pytest.mark.parametrize(
    ("algorithm", "graphs"), [("NGRAM", True), ("STANDALONE", True), ("STANDALONE", False)]
)
def test_patched_speculation_equals_shadow_bitwise(pair, algorithm: str, graphs: bool) -> None:
    events = session(pair, algorithm, disable_cuda_graph=not graphs)
    done = [e for e in events if isinstance(e, PromptDone)]
    steps = [e for e in events if isinstance(e, VerifyStep)]
    assert len(done) == PROMPTS
    assert [e for e in events if isinstance(e, Divergence)] == []
    assert all(e.exact for e in done)
    assert steps and any(s.accepted > 0 for s in steps)  # multi-row commits happened


def test_stock_sglang_speculation_diverges(pair) -> None:
    events = session(pair, "NGRAM", unpatch=("gdn", "attention", "gemm", "telemetry"))
    divergences = [e for e in events if isinstance(e, Divergence)]
    assert divergences, "stock SGLang must diverge here"
    for d in divergences:  # the shadow's top-2 logprobs came back with its requests
        m = d.shadow_margin
        assert m is not None and m.gap >= 0, d
        assert m.top1_token == d.shadow_token or m.gap == 0, d  # a tie: top-k may pick either
