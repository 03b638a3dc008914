"""The SGLang backend's session around a stand-in for `sglang.Engine` (the real one needs CUDA): the
event stream the dashboard sees, telemetry over the real ZMQ path, the shadow comparison on
fp32 logprob bits, and SGLang's own refusal reason as the one-line error."""

from __future__ import annotations

import json
import logging
import os

import pytest
import standin_engine

from specdash.cli.headless import divergence_record
from specdash.errors import UsageError
from specdash.events import EVENT_ADAPTER, Divergence, PromptDone
from specdash.metrics import fp32_ulps
from specdash.runs.sglang import args, process
from specdash.runs.sglang.backend import WARM_UP_PHASE, WARM_UP_TEXT, warm_up_texts
from specdash.settings import SessionSettings
from specdash.trace.jsonl import read_trace
from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.divergence import margin_text, prefix_cached_text, requests_text

STANDIN = r"""
import contextlib, io, json, os, sys
from pathlib import Path
sys.path.insert(0, "tests/sglang")  # the shadow's host process imports the stand-in by name
import standin_engine
from specdash.runs.sglang import args, preflight, process

workdir = Path(os.environ["WORKDIR"])
prompts = workdir / "p.jsonl"
prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in standin_engine.PROMPTS))
process.patched_engine_class = standin_engine.engine_class
preflight.check_startable = lambda options, engines: None
"""
"""A script's start: the stand-in engine in place of SGLang's, the stand-in's prompts written."""

SESSION_SCRIPT = (
    STANDIN
    + r"""
from specdash.runs.runner import run_engine
from specdash.settings import SessionSettings
events = []
settings = SessionSettings(engine="sglang", model=Path("/models/m"), k=2, prompts=prompts,
                           gemm_backend="deepgemm", max_new_tokens=8,
                           batch=int(os.environ.get("BATCH", "1")),
                           speculation=os.environ.get("SPECULATION", "1") == "1")
options = args.SGLangOptions(speculative_algorithm="EAGLE3",
                                      engine_args={"mem_fraction_static": 0.3},
                                      shadow_mode=os.environ["SHADOW_MODE"],
                                      log_file=workdir / "sglang.log")
summary = run_engine(settings, events.append, options=options)
print("RESULT " + json.dumps({
    "events": [json.loads(e.model_dump_json()) for e in events],
    "summary": json.loads(summary.model_dump_json()),
    "engines": standin_engine.recorded(workdir),
}))
"""
)


TOKENS = [
    (0, 5, "decode"),
    (0, 6, "draft"),
    (0, 7, "draft"),
    (0, 8, "bonus"),
    (0, 9, "bonus"),
    (1, 1, "decode"),
    (1, 2, "draft"),
    (1, 3, "bonus"),
]
"""(prompt, token id, source) of the stand-in's output tokens, at any batch size."""


@pytest.fixture(scope="module")
def stand_in_session(run_sglang, tmp_path_factory):
    """SESSION_SCRIPT's result for a shadow mode, the script run once per mode in this module:
    the event-stream test and the dashboard test read the same session."""
    lines: dict[str, str] = {}

    def session(shadow_mode: str) -> dict:
        if shadow_mode not in lines:
            workdir = tmp_path_factory.mktemp(f"session-{shadow_mode}")
            env = {"WORKDIR": str(workdir), "SHADOW_MODE": shadow_mode}
            stdout = run_sglang(SESSION_SCRIPT, env=env).stdout.splitlines()
            lines[shadow_mode] = next(x for x in stdout if x.startswith("RESULT "))[7:]
        return json.loads(lines[shadow_mode])  # a fresh copy for each test

    return session


def session_steps(events: list[dict], batch: int) -> None:
    """Every event's `step` is the session step (`VerifyStep.step`): a batch of `batch`
    requests run to the end is one, so prompt i's events all carry i // batch."""
    for e in events:
        if e["kind"] in ("verify_step", "token", "divergence"):
            assert e["step"] == e["prompt_index"] // batch, e


@pytest.mark.parametrize("shadow_mode", ["split", "sequential"])
def test_session_events_from_a_stand_in_engine(stand_in_session, shadow_mode) -> None:
    r = stand_in_session(shadow_mode)
    kinds = [e["kind"] for e in r["events"]]
    starts = [(e["engine"], e["phase"]) for e in r["events"] if e["kind"] == "start_phase"]
    before = 6 if shadow_mode == "split" else 3  # sequential: the shadow starts after the spec
    assert kinds[: before + 1] == ["start_phase"] * before + ["session_start"]
    phases = ("imports, spawn processes", WARM_UP_PHASE, "ready")
    assert sorted(starts) == sorted((e, p) for e in ("shadow", "spec") for p in phases)
    for engine in ("spec", "shadow"):  # the warm-up is the last phase before "ready"
        own = [p for e, p in starts if e == engine]
        assert own == list(phases), own
    if shadow_mode == "split":  # started together: the shadow in its host process
        assert starts[0] == ("shadow", "imports, spawn processes") and starts[-1] == (
            "shadow",
            "ready",
        )
    spec, shadow = r["engines"]
    spec_kw, shadow_kw = spec["kw"], shadow["kw"]
    assert (spec["pid"] == os.getpid()) is False  # the script's process, not pytest's
    assert (spec["pid"] != shadow["pid"]) is (shadow_mode == "split")
    # started together, the two size their memory pools in turn (memory_pools_in_turn)
    turn = spec["pool_turn"] if shadow_mode == "split" else None
    assert spec["pool_turn"] == shadow["pool_turn"] == turn and (turn is None) is (
        shadow_mode == "sequential"
    )
    assert spec_kw["speculative_algorithm"] == "EAGLE3" and spec_kw["speculative_num_steps"] == 2
    assert spec_kw["enable_deterministic_inference"] and spec_kw["mamba_ssm_dtype"] == "float32"
    assert spec_kw["mem_fraction_static"] == 0.3  # --sglang-arg wins over the split default
    assert spec_kw["cuda_graph_bs_decode"] == [1] and spec_kw["disable_prefill_cuda_graph"]
    assert spec_kw["log_level"] == "info"  # the start phases are read from the log
    assert "speculative_algorithm" not in shadow_kw and spec["shut"] and shadow["shut"]
    switch = [["specdash_set_gemm_backend", {"name": "deepgemm"}]]
    assert [spec["rpcs"], shadow["rpcs"]] == [switch, switch]  # the same GEMM backend
    # one warm-up request per engine before the session's clock (k + 2 tokens: a verify step),
    # then the prefix cache flushed; never counted as a prompt of the session
    for engine in (spec, shadow):
        assert engine["warm_ups"] == [[[WARM_UP_TEXT], 4]] and engine["flushes"] == 1

    # the typed header: SGLang's engine, its algorithm and its GEMM routes (the dashboard's `g`)
    (start,) = [e for e in r["events"] if e["kind"] == "session_start"]
    assert (start["engine"], start["speculative_algorithm"]) == ("sglang", "EAGLE3")
    assert (start["gemm_backend"], start["quantization"], start["shadow"]) == (
        "deepgemm",
        None,
        True,
    )
    routes = {c["name"]: c["unavailable"] for c in start["gemm_backends"]}
    assert {"auto", "sglang-triton", "specdash-triton", "deepgemm"} <= set(routes)
    assert routes["auto"] is None and routes["sglang-triton"] is None
    assert routes["deepgemm"] is not None  # no SGLang here to run DeepGEMM: it says why
    steps = [e for e in r["events"] if e["kind"] == "verify_step"]
    assert [(s["prompt_index"], s["accepted"], s["emitted_tokens"]) for s in steps] == [
        (0, 2, [6, 7, 8]),
        (0, 0, [9]),
        (1, 1, [2, 3]),
    ]
    session_steps(r["events"], batch=1)
    assert all(s["gemm_backend"] == "deepgemm" and s["verify_s"] == 0.002 for s in steps)
    tokens = [
        (e["prompt_index"], e["token_id"], e["source"]) for e in r["events"] if e["kind"] == "token"
    ]
    assert tokens == TOKENS
    div = [e for e in r["events"] if e["kind"] == "divergence"]
    assert len(div) == 1 and (div[0]["prompt_index"], div[0]["position"]) == (1, 2)
    assert div[0]["what"] == "logprob" and div[0]["spec_token"] == div[0]["shadow_token"] == 3
    done = [(e["prompt_index"], e["exact"]) for e in r["events"] if e["kind"] == "prompt_done"]
    assert done == [(0, True), (1, False)]
    assert r["summary"]["exact_prompts"] == 1 and r["summary"]["verify_steps"] == 3
    assert r["summary"]["divergences"] == 1
    # each prompt's shadow request is timed (alone, prefill inside, as the speculative side),
    # so the summary has a shadow rate and a ratio in both shadow modes
    assert all(e["shadow_seconds"] > 0 for e in r["events"] if e["kind"] == "prompt_done")
    assert r["summary"]["shadow_tokens_per_s"] > 0 and r["summary"]["rate_includes_prefill"]


@pytest.mark.parametrize("shadow_mode", ["split", "sequential"])
def test_batch_sends_the_prompts_at_once_and_checks_each_alone(
    run_sglang, tmp_path, shadow_mode
) -> None:
    """--batch 2: one request batch on the speculative engine (its decode graphs captured up to
    2), the shadow one prompt at a time; each request's verify steps reach its own prompt by
    request id, each prompt gets its own verdict, the summary the batch's acceptance."""
    env = {"WORKDIR": str(tmp_path), "SHADOW_MODE": shadow_mode, "BATCH": "2"}
    r = json.loads(
        next(
            x[7:]
            for x in run_sglang(SESSION_SCRIPT, env=env).stdout.splitlines()
            if x.startswith("RESULT ")
        )
    )
    spec, shadow = r["engines"]
    assert spec["batches"] == [2] and shadow["batches"] == [1, 1]
    # each engine warmed up as the session runs it: two requests at once, texts apart from
    # their first token; the shadow one
    assert spec["warm_ups"] == [[warm_up_texts(2), 4]] and shadow["warm_ups"] == [
        [[WARM_UP_TEXT], 4]
    ]
    assert warm_up_texts(2)[0][0] != warm_up_texts(2)[1][0]
    assert spec["kw"]["cuda_graph_bs_decode"] == [1, 2]
    assert shadow["kw"]["cuda_graph_bs_decode"] == [1]
    events = r["events"]
    kinds = [e["kind"] for e in events if e["kind"] != "start_phase"]
    assert kinds[:3] == ["session_start", "prompt_start", "prompt_start"]
    steps = [
        (e["prompt_index"], e["accepted"], e["emitted_tokens"])
        for e in events
        if e["kind"] == "verify_step"
    ]
    assert steps == [(0, 2, [6, 7, 8]), (1, 1, [2, 3]), (0, 0, [9])]  # as they came
    session_steps(events, batch=2)
    tokens = [
        (e["prompt_index"], e["token_id"], e["source"]) for e in events if e["kind"] == "token"
    ]
    assert tokens == TOKENS
    div = [
        (e["prompt_index"], e["position"], e["step"]) for e in events if e["kind"] == "divergence"
    ]
    assert div == [(1, 2, 0)]  # the batch's session step
    done = [(e["prompt_index"], e["exact"]) for e in events if e["kind"] == "prompt_done"]
    assert done == [(0, True), (1, False)]
    model = DashboardModel()  # the dashboard: both requests in flight, then each one's verdict
    first_step = next(i for i, e in enumerate(events) if e["kind"] == "verify_step")
    for i, e in enumerate(events):
        model.consume(EVENT_ADAPTER.validate_python(e))
        if i == first_step:
            assert requests_text(model, 60).plain == "requests ••  2 in flight"
    assert requests_text(model, 60).plain == "requests ✓✗"
    summary = r["summary"]
    assert (summary["prompts"], summary["exact_prompts"], summary["verify_steps"]) == (2, 1, 3)
    assert summary["acceptance_rate"] == 3 / 6 and summary["mean_accepted_length"] == 6 / 3


def test_batch_above_what_the_engine_runs_at_once_is_refused(capsys, tmp_path) -> None:
    """A cap on running requests, or decode graphs stopping short of the batch: one line, exit
    2, before anything starts (the CUDA check, which would say exit 4 here, comes later)."""
    from specdash.cli import main

    base = ["run", "--headless", "--engine", "sglang", "--model", str(tmp_path), "--batch", "4"]
    for arg, what in (
        ("max_running_requests=2", "but max_running_requests=2"),
        ("cuda_graph_bs_decode=[1,2]", "but the decode CUDA graphs stop at batch size 2"),
        ("cuda_graph_max_bs_decode=3", "but the decode CUDA graphs stop at batch size 3"),
    ):
        assert main([*base, "--sglang-arg", arg]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"specdash: error: --batch: 4 requests at once, {what}")
        assert err.count("\n") == 1
    options = args.SGLangOptions(engine_args={"cuda_graph_bs_decode": [1, 2]})
    settings = SessionSettings(engine="sglang", model=tmp_path, batch=4)
    graphs_off = args.SGLangOptions(
        engine_args={"cuda_graph_bs_decode": [1], "disable_cuda_graph": True}
    )
    assert args.engine_kwargs(settings, graphs_off, speculative=True, split=False, requests=4)
    with pytest.raises(UsageError):
        args.engine_kwargs(settings, options, speculative=True, split=False, requests=4)


def test_decode_graphs_cover_the_batch() -> None:
    assert [args.decode_graph_sizes(n) for n in (1, 2, 3, 6, 8)] == [
        [1],
        [1, 2],
        [1, 2, 3],
        [1, 2, 4, 6],
        [1, 2, 4, 8],
    ]


def test_engine_refusal_shows_sglang_reason(monkeypatch, tmp_path) -> None:
    class RefusingEngine:
        def __init__(self, **kw):  # what a scheduler process does when the model says no
            handler = process._ReasonToFile(os.environ[process.ERROR_FILE_ENV])
            log = logging.getLogger("test.scheduler")
            log.addHandler(handler)
            log.error(
                "Scheduler hit an exception: Traceback (most recent call last):\n"
                '  File "x.py", line 1, in <module>\n'
                "ValueError: DFLASH is not supported for Qwen3NextForCausalLM\n"
            )
            log.removeHandler(handler)
            raise RuntimeError("Initialization failed. Please see the error messages above.")

    monkeypatch.setattr(process, "patched_engine_class", lambda: RefusingEngine)
    monkeypatch.setenv(process.ERROR_FILE_ENV, str(tmp_path / "reason"))
    with pytest.raises(UsageError) as e:
        process.start_engine({"speculative_algorithm": "DFLASH"})
    assert str(e.value) == (
        "sglang could not start with speculative algorithm DFLASH: "
        "ValueError: DFLASH is not supported for Qwen3NextForCausalLM"
    )


def test_sglang_args_parse_as_python_literals() -> None:
    parse = args.parse_engine_arg
    assert parse("mem_fraction_static=0.4") == ("mem_fraction_static", 0.4)
    assert parse("disable-cuda-graph=true") == ("disable_cuda_graph", True)
    assert parse("attention_backend=fa3") == ("attention_backend", "fa3")
    assert parse('cuda_graph_config={"decode": {"max_bs": 8}}')[1] == {"decode": {"max_bs": 8}}
    with pytest.raises(UsageError, match="expected KEY=VALUE"):
        parse("no_equals_sign")


def test_engine_kwargs_per_algorithm(tmp_path, monkeypatch) -> None:
    from specdash.runs.sglang.patches import registry

    monkeypatch.setattr(registry, "sglang_version", lambda: "0.5.23")

    settings = SessionSettings(engine="sglang", model=tmp_path, k=3)

    def kwargs(algo: str, **extra) -> dict:
        options = args.SGLangOptions(speculative_algorithm=algo, engine_args=extra)
        return args.engine_kwargs(settings, options, speculative=True, split=False)

    nextn = kwargs("NEXTN")
    assert (nextn["speculative_num_steps"], nextn["speculative_eagle_topk"]) == (3, 1)
    assert nextn["speculative_num_draft_tokens"] == 4
    assert nextn["speculative_draft_model_path"] == str(tmp_path)  # MTP: the target itself
    assert nextn["linear_attn_backend"] == "triton" and nextn["attention_backend"] == "triton"
    dflash = kwargs("DFLASH")  # its block: the anchor and k drafts, not the draft's 16
    assert not {"speculative_num_steps", "speculative_eagle_topk"} & set(dflash)
    assert dflash["speculative_num_draft_tokens"] == 4
    # text prompts: no image processor, unless --sglang-arg asks for one
    assert nextn["enable_multimodal"] is False
    assert kwargs("NEXTN", enable_multimodal=True)["enable_multimodal"] is True
    ngram = kwargs("NGRAM")  # k + 1 verify tokens; SGLang's breadth, so GDN verify sees trees
    assert ngram["speculative_num_draft_tokens"] == 4
    assert "speculative_ngram_max_bfs_breadth" not in ngram
    assert nextn["disable_decode_cuda_graph"]  # 0.5.23's Triton verify rows are eager-only
    monkeypatch.setattr(registry, "sglang_version", lambda: "0.5.99")  # --force-patches
    monkeypatch.setenv(registry.ROW_ENV, "0.5.23")
    assert kwargs("NEXTN")["disable_decode_cuda_graph"]  # the row applied, not the release
    monkeypatch.setenv(registry.ROW_ENV, "0.5.17")
    assert "disable_decode_cuda_graph" not in kwargs("NEXTN")
    monkeypatch.setattr(registry, "sglang_version", lambda: "0.5.17")
    assert "disable_decode_cuda_graph" not in kwargs("NEXTN")  # 0.5.17's rows are graphed
    fa3 = kwargs("EAGLE3", attention_backend="fa3")
    assert fa3["attention_backend"] == "fa3" and "disable_decode_cuda_graph" not in fa3
    assert "disable_decode_cuda_graph" not in kwargs("NEXTN", cuda_graph_max_bs_decode=8)
    with pytest.raises(UsageError, match="needs a checkpoint") as e:
        args.engine_kwargs(
            SessionSettings(engine="sglang"),
            args.SGLangOptions(),
            speculative=True,
            split=False,
        )
    assert e.value.setting == "model"  # the command line names --model


def test_no_speculation_is_not_checked(run_sglang, tmp_path) -> None:
    """With speculation off SGLang runs no shadow: nothing was compared, so the summary says
    "not checked" (exact_prompts None), never "0 exact"."""
    env = {"WORKDIR": str(tmp_path), "SHADOW_MODE": "split", "SPECULATION": "0"}
    proc = run_sglang(SESSION_SCRIPT, env=env)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    start = next(e for e in r["events"] if e["kind"] == "session_start")
    assert start["shadow"] is False and len(r["engines"]) == 1
    assert start["speculative_algorithm"] is None  # no speculative engine started
    assert r["summary"]["checked"] is False and r["summary"]["exact_prompts"] is None
    # SGLang's requests hold their prefill: the header says so, and the summary carries it
    assert start["rate_includes_prefill"] is True
    assert r["summary"]["rate_includes_prefill"] is True


CLI_SCRIPT = (
    STANDIN
    + r"""
from specdash.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["run", "--headless", "--json", "--engine", "sglang", "--model", str(workdir),
                 "--prompts", str(prompts), "-k", "2", "--max-new-tokens", "8",
                 "--speculative-algorithm", "EAGLE3", "--sglang-shadow", os.environ["SHADOW_MODE"],
                 "--trace", str(workdir / "t.jsonl")])
print("RESULT " + json.dumps({"code": code, "json": json.loads(out.getvalue()),
                              "engines": standin_engine.recorded(workdir)}))
"""
)


@pytest.mark.parametrize("shadow_mode", ["split", "sequential"])
def test_divergence_carries_the_shadows_margin(run_sglang, tmp_path, shadow_mode) -> None:
    """The shadow engine's request asks SGLang for its top-2 logprobs (the speculative one's is
    unchanged: its speed is what is measured); the divergence's margin is the shadow's top-1
    minus top-2 there, the same bits in the event, the trace and --json."""
    proc = run_sglang(CLI_SCRIPT, env={"WORKDIR": str(tmp_path), "SHADOW_MODE": shadow_mode})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    spec, shadow = r["engines"]
    # None: SGLang's own default, the request it was before; the shadow asks one prompt at a time
    assert spec["top_logprobs_nums"] == [None, None] and shadow["top_logprobs_nums"] == [2, 2]

    (top1, top2) = standin_engine.shadow_top2(1, 2)
    _, events, _ = read_trace(tmp_path / "t.jsonl")
    (d,) = [e for e in events if isinstance(e, Divergence)]
    assert (d.prompt_index, d.position, d.what) == (1, 2, "logprob")
    m = d.shadow_margin
    assert m is not None and (m.top1_token, m.top2_token) == (top1[0], top2[0])
    assert m.gap == top1[1] - top2[1] and m.gap > 0  # exact: the same doubles subtracted
    assert m.ulps == 1 == fp32_ulps(top1[1], top2[1]) and m.near_tie  # bf16 model
    assert d.shadow_logprob == top1[1]  # the top-1 is the token the shadow emitted
    record = r["json"]["divergences"]
    assert record == [json.loads(json.dumps(divergence_record(d)))]
    assert record[0]["shadow_margin"] == m.model_dump()
    # the tokens before it, decoded by the engine's tokenizer: the prompt's, then the output's
    prompt_ids = standin_engine.StandInTokenizer().encode(standin_engine.PROMPTS[1])
    assert d.context == "".join(f"<{t}>" for t in [*prompt_ids, *standin_engine.IDS[1][:2]])
    # the prompt tokens each engine read from its prefix cache, as SGLang counted them
    assert d.prefix_cached == standin_engine.CACHED_TOKENS[1] == (3, 0)
    assert record[0]["prefix_cached"] == [3, 0]
    assert "3 prompt tokens cached (spec), 0 (shadow): the prefills differed" in (
        prefix_cached_text(d.prefix_cached)
    )
    assert "1 fp32 ulps" in margin_text(d) and "near-tie" in margin_text(d)


BENCH_SCRIPT = (
    STANDIN
    + r"""
sys.path.insert(0, "benchmarks")
import bench_dashboard
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = bench_dashboard.main([
        "--repeats", "1", "--warmup", "none", "--json", str(workdir / "bench.json"),
        "--engine", "sglang", "--model", str(workdir), "--prompts", str(prompts), "-k", "2",
        "--max-new-tokens", "8", "--speculative-algorithm", "NGRAM",
        "--sglang-arg", "mem_fraction_static=0.3", "--only", "headless", "dashboard-thread"])
print("RESULT " + json.dumps({"code": code, "out": out.getvalue(),
                              "engines": standin_engine.recorded(workdir)}))
"""
)


def test_dashboard_cost_bench_runs_the_sglang_session_of_its_flags(run_sglang, tmp_path) -> None:
    """benchmarks/bench_dashboard.py takes `specdash run`'s SGLang flags: its headless run is that
    session on the engine the flags build (here the stand-in), counted from the session's
    header, after both engines' starts; the dashboard on an engine thread is not run (SGLang
    starts only on a main thread)."""
    proc = run_sglang(BENCH_SCRIPT, env={"WORKDIR": str(tmp_path)})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["code"] == 0 and "dashboard-thread: not run" in r["out"]
    spec, shadow = r["engines"]
    assert (
        spec["kw"]["speculative_algorithm"] == "NGRAM" and spec["kw"]["mem_fraction_static"] == 0.3
    )
    assert spec["shut"] and shadow["shut"]
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["settings"]["engine"] == "sglang" and record["settings"]["k"] == 2
    assert record["sglang"]["speculative_algorithm"] == "NGRAM"
    assert record["sglang"]["engine_args"] == {"mem_fraction_static": "0.3"}
    (run,) = record["runs"]
    assert run["mode"] == "headless" and run["tokens"] == len(TOKENS) and run["engine_tps"] > 0
    assert 0 < run["start_s"] < run["wall_s"]


class _Events:
    """The stand-in session's events as the dashboard's event source, pushed at once."""

    controls = None

    def __init__(self, events: list) -> None:
        self.events = events

    def start(self, sink) -> None:
        for event in self.events:
            sink(event)

    def stop(self) -> None:
        pass


@pytest.mark.parametrize("shadow_mode", ["split", "sequential"])
async def test_dashboard_shows_sglangs_rates_per_request(stand_in_session, shadow_mode) -> None:
    """SGLang times whole requests, not verify steps: the throughput panel shows each finished
    request's spec and shadow t/s and the session's speedup (the summary's), and its chart one
    point per request, with the shadow's rate beside the speculative one."""
    from specdash.ui.app import SpecdashApp
    from specdash.ui.widgets.throughput import REQUEST_UNITS

    r = stand_in_session(shadow_mode)
    events = [EVENT_ADAPTER.validate_python(e) for e in r["events"]]
    done = [e for e in events if isinstance(e, PromptDone)]
    app = SpecdashApp(_Events(events))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        app.refresh_plots()
        await pilot.pause()
        numbers = str(app.query_one("#throughput-numbers").render()).splitlines()
        key = str(app.query_one("#throughput .chart-key").render())
    last, session = done[-1], r["summary"]
    cells = numbers[1].split()
    assert cells[:2] == ["last", "req"]
    spec, shadow = last.new_tokens / last.seconds, last.new_tokens / last.shadow_seconds
    assert [float(c) for c in cells[3:5]] == [
        pytest.approx(spec, abs=0.5),
        pytest.approx(shadow, abs=0.5),
    ]
    assert cells[5] == f"{spec / shadow:.2f}x"
    spec, shadow = session["tokens_per_s"], session["shadow_tokens_per_s"]
    cells = numbers[2].split()
    assert cells[0] == "session" and cells[-1] == f"{spec / shadow:.2f}x"
    assert [float(c) for c in cells[2:4]] == [
        pytest.approx(spec, abs=0.5),
        pytest.approx(shadow, abs=0.5),
    ]
    points = app.model.tps_series.points
    assert [p[1:] for p in points] == [
        pytest.approx((e.new_tokens / e.seconds, e.new_tokens / e.shadow_seconds)) for e in done
    ]
    assert all(p[2] > 0 for p in points) and REQUEST_UNITS in key
