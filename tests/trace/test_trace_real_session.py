"""The trace tools on real recordings of the native engine, not synthetic streams.

`tests/trace/traces/native-tiny-v1.jsonl` was recorded once (`specdash run --headless` on the tiny
random checkpoints of `tiny_models.write_pair`, 2 prompts, 12 tokens, k=3) and is kept as is:
every later specdash must still read a v1 trace. The other tests record fresh sessions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fake_events import ScriptedSource
from test_export import check_chrome_trace
from test_replay import SIZE, FakeClock, panel_text, settle
from tiny_models import write_pair

from specdash.cli import main
from specdash.errors import EXIT_OK
from specdash.events import Token, VerifyStep
from specdash.trace.jsonl import read_trace
from specdash.trace.replay import TraceReplay
from specdash.trace.report import PLOTS
from specdash.ui.app import SpecdashApp
from specdash.ui.replay_app import ReplayApp

GOLDEN = Path(__file__).parent / "traces" / "native-tiny-v1.jsonl"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, Path]:
    """Two real sessions of the same prompts: speculative, and plain greedy (--no-spec)."""
    root = tmp_path_factory.mktemp("real")
    target, draft, prompts = write_pair(root)
    two = root / "two.jsonl"
    two.write_text("".join(prompts.read_text().splitlines(keepends=True)[:2]))
    traces = {}
    for name, extra in (("spec", []), ("plain", ["--no-spec"])):
        traces[name] = root / f"{name}.jsonl"
        argv = ["run", "--headless", "--model", str(target), "--draft", str(draft),
                "--prompts", str(two), "--max-new-tokens", "12", "-k", "3",
                "--trace", str(traces[name]), *extra]  # fmt: skip
        assert main(argv) == EXIT_OK
    return traces


@pytest.mark.parametrize("which", ["golden", "spec"])
def test_real_trace_reads_back_whole(recorded, which):
    path = GOLDEN if which == "golden" else recorded["spec"]
    header, events, warnings = read_trace(path)
    assert warnings == []
    assert header.schema_version == ("specdash/v1" if which == "golden" else "specdash/v3")
    assert header.versions["torch"] and header.config["k"] == 3
    # typed (a v1 header's from its config): the engine, what `g` cycles, the drafter's algorithm
    assert (header.engine, header.speculative_algorithm, header.shadow) == (
        "native",
        "STANDALONE",
        True,
    )
    assert header.usable_gemm_backends == ["torch"] and header.quantization is None
    assert events[-1].kind == "summary" and events[-1].prompts == 2
    tokens = [e for e in events if isinstance(e, Token)]
    steps = [e for e in events if isinstance(e, VerifyStep)]
    assert len(tokens) == 24 and sum(len(s.emitted_tokens) for s in steps) <= 24
    for p in (0, 1):  # generated-token index from 0 (a v1 native trace counted the prompt)
        assert [t.position for t in tokens if t.prompt_index == p] == list(range(12))
    if which == "spec":
        assert header.git_revision is not None  # filled in by the writer from this checkout


def test_speculative_and_plain_greedy_traces_are_identical(recorded, capsys):
    """The product's promise, checked with the user's tool: ids and logprob bits equal."""
    assert main(["diff", str(recorded["spec"]), str(recorded["plain"])]) == EXIT_OK
    out = capsys.readouterr().out
    assert "summary: 0 of 2 prompts differ" in out


def test_real_trace_exports_and_reports(recorded, tmp_path):
    out = tmp_path / "p.json"
    assert main(["export", str(GOLDEN), "--format", "perfetto", "-o", str(out)]) == EXIT_OK
    doc = json.loads(out.read_text())
    check_chrome_trace(doc)
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert {"draft", "verify", "shadow"} <= names
    html = tmp_path / "r.html"
    assert main(["report", str(recorded["spec"]), "-o", str(html)]) == EXIT_OK
    page = html.read_text()
    found = set(re.findall(r"<figure id='plot-([a-z-]+)'><figcaption>[^<]+</figcaption><img", page))
    assert found == set(PLOTS)


async def test_real_trace_cut_mid_line_replays_like_live(recorded, tmp_path):
    data = recorded["spec"].read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: data.rindex(b'"kind":"token"') + 5])  # killed inside a token line
    header, events, warnings = read_trace(cut)
    assert len(warnings) == 1 and events[-1].kind != "summary"
    clock = FakeClock()
    app = ReplayApp(TraceReplay(header, events, clock=clock), name="cut", warnings=warnings)
    async with app.run_test(size=SIZE) as pilot:
        clock.t += 1e6
        app.tick()
        await settle(pilot)
        replayed = panel_text(app)
    live = SpecdashApp(ScriptedSource.live_like([header, *events]))
    async with live.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert panel_text(live) == replayed
