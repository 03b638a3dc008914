"""Session behaviour around the prompt set: typed prompts, live controls, slots."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fake_events import folded

from specdash.controls import Controls
from specdash.events import ControlChange, EngineError, Event, PromptDone, PromptStart
from specdash.runs.native import native_session
from specdash.settings import SessionSettings


def _settings(pair: tuple[Path, Path, Path], **kw: object) -> SessionSettings:
    return SessionSettings(model=pair[0], draft=pair[1], prompts=pair[2], max_new_tokens=8, **kw)


def test_typed_prompts_run_first_and_a_bad_one_does_not_end_the_session(pair) -> None:
    controls = Controls.from_settings(_settings(pair, k=3), "torch")
    controls.submit_prompt("def typed():")
    controls.submit_prompt("x" * 20000)  # longer than the model's context
    events: list[Event] = []
    native_session(_settings(pair, k=3), events.append, controls).run()
    starts = [e for e in events if isinstance(e, PromptStart)]
    assert starts[0].text == "def typed():" and starts[0].prompt_index == 8
    errors = [e for e in events if isinstance(e, EngineError)]
    assert len(errors) == 1 and not errors[0].fatal and "positions" in errors[0].message
    done = [e for e in events if isinstance(e, PromptDone)]
    assert len(done) == 9 and all(d.exact for d in done)


def test_control_changes_apply_between_steps_and_are_events(pair) -> None:
    controls = Controls.from_settings(_settings(pair, k=2), "torch")
    events: list[Event] = []

    def sink(e: Event) -> None:
        events.append(e)
        if e.kind == "verify_step" and e.step == 3:
            controls.update(k=5, verify_mode="fast", speculation=False)

    native_session(_settings(pair, k=2), sink, controls).run()
    changes = {e.name: e for e in events if isinstance(e, ControlChange)}
    assert set(changes) == {"k", "verify_mode", "speculation"}
    assert all(c.applied_step == 4 for c in changes.values())
    steps = [e for e in events if e.kind == "verify_step"]
    assert all(s.k == 2 for s in steps if s.step <= 3)
    assert all(s.k == 0 and s.draft_tokens == [] for s in steps if s.step >= 4)


def test_pause_and_resume_are_both_recorded(pair) -> None:
    import threading

    controls = Controls.from_settings(_settings(pair, k=3), "torch")
    events: list[Event] = []

    def sink(e: Event) -> None:
        events.append(e)
        if e.kind == "verify_step" and e.step == 2:
            controls.update(paused=True)
            threading.Timer(0.2, lambda: controls.update(paused=False)).start()

    native_session(_settings(pair, k=3), sink, controls).run()
    pauses = [(e.old, e.new) for e in events if isinstance(e, ControlChange)]
    assert pauses == [("False", "True"), ("True", "False")]


def test_unavailable_backend_is_refused_without_ending_the_session(pair) -> None:
    controls = Controls.from_settings(_settings(pair, k=3), "torch")
    events: list[Event] = []

    def sink(e: Event) -> None:
        events.append(e)
        if e.kind == "verify_step" and e.step == 1:
            controls.update(gemm_backend="deepgemm")

    summary = native_session(_settings(pair, k=3), sink, controls).run()
    errors = [e for e in events if isinstance(e, EngineError)]
    assert len(errors) == 1 and not errors[0].fatal and "deepgemm" in errors[0].message
    assert controls.snapshot().gemm_backend == "torch"
    assert not any(isinstance(e, ControlChange) for e in events)
    assert summary.prompts == summary.exact_prompts == 8


def test_plain_steps_with_speculation_off_are_not_verify_steps(pair) -> None:
    """Speculation switched off mid-session (`s`): the plain decode steps that follow count
    towards throughput but not as verify steps with 0 accepted, in every consumer."""
    from specdash.stats import SessionStats
    from specdash.trace.export import perfetto_trace, step_rows
    from specdash.trace.report import _summary, acceptance_by_position
    from specdash.ui.dashboard_model import DashboardModel

    controls = Controls.from_settings(_settings(pair, k=3), "torch")
    events: list[Event] = []

    def sink(e: Event) -> None:
        events.append(e)
        if e.kind == "verify_step" and e.step == 2:
            controls.update(speculation=False)

    summary = native_session(_settings(pair, k=3), sink, controls).run()
    steps = [e for e in events if e.kind == "verify_step"]
    verify = [s for s in steps if s.step <= 2]
    assert len(steps) > len(verify) and all(s.plain for s in steps if s.step > 2)
    accepted, emitted = sum(s.accepted for s in verify), sum(len(s.emitted_tokens) for s in verify)
    assert summary.verify_steps == len(verify)
    assert summary.mean_accepted_length == emitted / len(verify)
    assert summary.acceptance_rate == accepted / sum(len(s.draft_tokens) for s in verify)
    done = [e for e in events if isinstance(e, PromptDone)]
    assert sum(d.verify_steps for d in done) == len(verify)
    assert sum(d.accepted_drafts for d in done) == accepted

    model = DashboardModel()
    stats = SessionStats()
    for e in events:
        model.consume(e)
        stats.consume(e)
    assert stats.summary().verify_steps == model.verify_steps == len(verify)
    assert sum(model.histogram.values()) == len(verify)
    assert model.histogram == Counter(s.accepted for s in verify)
    assert model.mean_accepted_length == emitted / len(verify)
    assert model.session_steps.tokens == sum(len(s.emitted_tokens) for s in steps)
    assert model.exactness == "EXACT so far"

    header = events[0]
    rows = step_rows(header, events)
    assert [r.plain for r in rows] == [s.plain for s in steps]
    assert dict(_summary(None, rows))["verify steps"] == len(verify)
    tried_first = sum(r.drafted > 0 for r in rows if not r.plain)
    assert acceptance_by_position(rows)[0] == sum(s.accepted > 0 for s in verify) / tried_first
    counters = [
        ev for ev in perfetto_trace(header, events)["traceEvents"]
        if ev["name"] == "accepted_per_step"
    ]  # fmt: skip
    assert len(counters) == len(verify)


def test_no_spec_session_has_no_verify_steps_and_a_verdict(pair) -> None:
    events: list[Event] = []
    summary = native_session(_settings(pair, speculation=False), events.append).run()
    assert summary.verify_steps == 0 and summary.mean_accepted_length == 0.0
    assert summary.exact_prompts == summary.prompts == 8
    model = folded(events)
    assert model.verify_steps == 0 and not model.histogram
    assert model.exactness == "EXACT so far"


def test_speculation_switched_on_loads_the_draft_model(pair) -> None:
    """A session started with speculation off and --drafter model has no draft loaded; `s`
    on loads it, and the drafts are the draft model's (not a silent n-gram stand-in)."""
    from specdash.engine.drafters import ModelDrafter

    settings = _settings(pair, k=3, speculation=False)
    controls = Controls.from_settings(settings, "torch")
    events: list[Event] = []
    drafters: list[object] = []

    def sink(e: Event) -> None:
        events.append(e)
        if e.kind == "verify_step" and e.step == 1:
            controls.update(speculation=True)
        if e.kind == "draft":
            drafters.extend(type(seq.drafter) for seq in session.backend.seqs.values())

    session = native_session(settings, sink, controls)
    assert session.backend.loaded.draft is None
    session.run()
    assert session.backend.loaded.draft is not None
    drafts = [e for e in events if e.kind == "draft"]
    assert drafts and all(d.drafter == "model" for d in drafts)
    assert set(drafters) == {ModelDrafter}
    assert sum(len(d.tokens) for d in drafts) > 0
    assert all(d.exact for d in events if isinstance(d, PromptDone))


def short_draft(pair: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    """The draft with 64 positions: fewer than the tiny prompt set's longest needs."""
    import json
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(pair[1], draft)
    cfg = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(cfg | {"max_position_embeddings": 64}))
    return draft


@pytest.mark.parametrize(
    "make_draft,code,fragment",
    [
        (lambda pair, tmp_path: tmp_path / "missing", 3, "does not exist"),
        (short_draft, 2, "positions, the draft model ("),
    ],
    ids=["missing", "too-short-for-the-prompts"],
)
def test_a_draft_that_cannot_serve_keeps_speculation_off(
    pair, tmp_path, make_draft, code, fragment
) -> None:
    """Switched on mid-session, a draft that cannot load, or has fewer positions than a prompt
    of the session needs, is refused with a non-fatal error naming why; the session goes on."""
    draft = make_draft(pair, tmp_path)
    settings = _settings(pair, k=3, speculation=False).model_copy(update={"draft": draft})
    controls = Controls.from_settings(settings, "torch")
    events: list[Event] = []

    def sink(e: Event) -> None:
        events.append(e)
        if e.kind == "verify_step" and e.step == 1:
            controls.update(speculation=True)

    session = native_session(settings, sink, controls)
    session.run()
    errors = [e for e in events if isinstance(e, EngineError)]
    assert len(errors) == 1 and not errors[0].fatal and errors[0].exit_code == code
    assert errors[0].message.startswith("speculation stays off: the draft model did not load")
    assert fragment in errors[0].message and str(draft) in errors[0].message
    assert not [e for e in events if isinstance(e, ControlChange) and e.name == "speculation"]
    assert all(e.k == 0 for e in events if e.kind == "verify_step")
    assert session.backend.loaded.draft is None and controls.snapshot().speculation is False
    assert len([e for e in events if isinstance(e, PromptDone)]) == 8


def test_batch_steps_sequences_in_one_forward_with_the_same_bits(pair, monkeypatch) -> None:
    """--batch N: one batched forward a step for the N prompts in flight, and every prompt's
    tokens (ids and logprob bits) as at --batch 1."""
    from specdash.engine.model import Model
    from specdash.events import Token

    rows_per_forward: list[int] = []
    forward_pass = Model._forward_pass

    def counting(self, tokens, state, mode, *args):  # noqa: ANN001, ANN202
        if mode == "exact":  # the target's verify and shadow rows (drafts run `fast`)
            rows_per_forward.append(len(state) if isinstance(state, list) else 1)
        return forward_pass(self, tokens, state, mode, *args)

    monkeypatch.setattr(Model, "_forward_pass", counting)

    def tokens(batch: int) -> dict[int, list[tuple[int, str]]]:
        events: list[Event] = []
        summary = native_session(_settings(pair, k=3, batch=batch), events.append).run()
        assert summary.exact_prompts == summary.prompts == 8
        out: dict[int, list[tuple[int, str]]] = {}
        for e in events:
            if isinstance(e, Token):
                out.setdefault(e.prompt_index, []).append((e.token_id, e.logprob.hex()))
        return out

    one = tokens(1)
    assert max(rows_per_forward) == 1
    rows_per_forward.clear()
    assert tokens(4) == one
    assert max(rows_per_forward) == 4


def test_the_verify_mode_has_one_name_from_the_settings_to_the_events(pair) -> None:
    """`verify_mode` in the settings, the live controls, the control events and every verify
    step: nothing translates between names."""
    settings = _settings(pair, k=2, verify_mode="fast")
    controls = Controls.from_settings(settings, "torch")
    assert controls.snapshot().verify_mode == "fast"
    events: list[Event] = []

    def sink(e: Event) -> None:
        events.append(e)
        if e.kind == "verify_step" and e.step == 1:
            controls.update(verify_mode="exact")

    native_session(settings, sink, controls).run()
    assert events[0].kind == "session_start" and events[0].config["verify_mode"] == "fast"
    changes = [(e.name, e.new) for e in events if isinstance(e, ControlChange)]
    assert changes == [("verify_mode", "exact")]
    modes = [e.verify_mode for e in events if e.kind == "verify_step"]
    assert modes[:2] == ["fast", "fast"] and set(modes[2:]) == {"exact"}


def test_the_core_names_the_setting_and_the_command_line_its_flag(pair, capsys) -> None:
    from specdash.cli import main
    from specdash.engine.loader import load_models
    from specdash.errors import UsageError

    with pytest.raises(UsageError) as e:
        load_models(SessionSettings(model=pair[0], drafter="ngram", device="xpu"))
    assert e.value.setting == "device" and "--" not in str(e.value)
    assert main(["run", "--headless", "--model", str(pair[0]), "--device", "xpu"]) == 2
    err = capsys.readouterr().err
    assert err == "specdash: error: --device: 'xpu': only cpu and cuda are supported\n"
    with pytest.raises(UsageError) as e:
        load_models(SessionSettings(model=pair[0], drafter="model"))
    assert e.value.setting == "draft" and "--" not in str(e.value)


def test_every_step_field_is_the_session_step(pair) -> None:
    """`VerifyStep.step` (and a token's, a draft's) is the session's step counter, the one a
    control's `applied_step` counts: the prompts of a batch share it, the next batch goes on
    counting, and each step's tokens carry it (the prefill's: the step it came before)."""
    from specdash.events import Draft, Token, VerifyStep

    events: list[Event] = []
    native_session(_settings(pair, k=3, batch=2), events.append).run()
    steps: dict[int, list[int]] = {}
    for e in events:
        if isinstance(e, VerifyStep):
            steps.setdefault(e.prompt_index, []).append(e.step)
    assert len(steps) == 8
    groups = [(steps[p], steps[p + 1]) for p in range(0, 8, 2)]
    next_step = 0
    for a, b in groups:  # a batch's prompts start together, then go one step at a time
        assert a[0] == b[0] == next_step
        assert a == list(range(a[0], a[0] + len(a))) and b == list(range(b[0], b[0] + len(b)))
        next_step = max(a[-1], b[-1]) + 1
    emitted: dict[tuple[int, int], int] = {}  # (prompt, step) -> tokens that step emitted
    drafts = {(e.prompt_index, e.step) for e in events if isinstance(e, Draft)}
    for e in events:
        if isinstance(e, VerifyStep):
            emitted[e.prompt_index, e.step] = len(e.emitted_tokens)
            assert (e.prompt_index, e.step) in drafts
    for p in range(8):
        tokens = [e for e in events if isinstance(e, Token) and e.prompt_index == p]
        assert tokens[0].source == "decode" and tokens[0].step == steps[p][0]  # the prefill's
        by_step = Counter(t.step for t in tokens[1:])
        assert by_step == {s: emitted[p, s] for s in steps[p] if emitted[p, s]}


def test_the_header_names_the_kernel_the_cpus_gemm_runs(pair) -> None:
    """The CPU's one GEMM backend is named `torch`, but its exact fp32 GEMM is the compiled C
    loop: the header says so, and the dashboard's status bar shows what runs."""
    from specdash.kernels import cpu_gemm

    events: list[Event] = []
    native_session(_settings(pair, k=2), events.append).run()
    header = events[0]
    assert header.gemm_backend == "torch" and [
        (c.name, c.unavailable) for c in header.gemm_backends
    ] == [("torch", None)]
    compiled = cpu_gemm.load() is not None  # (no C compiler: torch's own per-row GEMM)
    assert header.config["gemm_kernel"] == ("C loop" if compiled else "torch")
    model = folded(events)
    assert model.gemm_kernel == ("C loop" if compiled else None)
    assert model.gemm_backends == ["torch"]
