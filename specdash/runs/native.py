"""The native runner: load weights, decode a prompt set with speculation and a shadow, emit events.

`NativeRunner.run(settings, sink, controls, stop)` is the `specdash.runs.runner.Runner`
protocol on specdash's own engine: it blocks, calls `sink(event)` from the calling thread,
reads `controls` once per step (so a change lands between steps) and returns the `Summary` it
also emitted. `SessionRunner` is one session's loop; `run_session` the one-call form.
"""

from __future__ import annotations

import contextlib
import platform
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path

import torch

from specdash.controls import Controls, ControlState
from specdash.engine import gemm_backends, memory
from specdash.engine.checkpoint import load_checkpoint
from specdash.engine.config import preset
from specdash.engine.drafters import Drafter, ModelDrafter, NgramDrafter
from specdash.engine.engine import Engine, Sequence, StepResult
from specdash.engine.model import Model
from specdash.engine.root_cause import find_root_cause
from specdash.engine.tokenizer import ByteTokenizer, TextTokenizer
from specdash.errors import CheckpointError, EnvironmentProblem, SpecdashError, UsageError
from specdash.events import (
    ControlChange,
    Draft,
    EngineError,
    Idle,
    Margin,
    Prefill,
    PromptStart,
    Sink,
    Summary,
    Token,
    VerifyStep,
)
from specdash.prompts import load_prompts
from specdash.runs.heap import trim_heap
from specdash.runs.session_events import SessionEvents, divergences_to_report, shadow_margin
from specdash.settings import MAX_K, SessionSettings

Queued = tuple[int, str, list[int]]
"""A prompt waiting to decode: its index, text and token ids."""
SMALL_MODEL_PARAMS = 50_000_000


def default_checkpoint(name: str) -> Path:
    """The embedded tiny pair shipped inside the package (`target`, `draft`)."""
    return Path(str(resources.files("specdash") / "data" / name))


@dataclass(slots=True)
class Loaded:
    target: Model
    draft: Model | None
    tokenizer: TextTokenizer
    eos_ids: list[int]
    description: dict[str, str]


def _device(settings: SessionSettings) -> torch.device:
    try:
        dev = torch.device(settings.device)
    except RuntimeError:
        raise UsageError(f"--device {settings.device!r}: expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {settings.device!r}: only cpu and cuda are supported")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EnvironmentProblem(f"--device {settings.device}: no CUDA device is available")
    return dev


def _dtype(settings: SessionSettings, device: torch.device) -> torch.dtype:
    name = settings.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    return getattr(torch, name)


def _load_one(
    path: Path | None,
    preset_name: str | None,
    dtype: torch.dtype,
    device: torch.device,
    gemm: gemm_backends.GemmBackend,
    seed: int,
) -> tuple[Model, TextTokenizer, list[int]]:
    if preset_name is not None:
        cfg = preset(preset_name)
        memory.require_room(f"--preset {preset_name}", cfg, dtype, device)
        return Model.random(cfg, seed, dtype, device, gemm), ByteTokenizer(cfg.vocab_size), []
    assert path is not None
    cfg, tensors, hf_tok = load_checkpoint(path, dtype, str(device))
    tok = TextTokenizer(hf_tok)
    if tok.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{path}: tokenizer has {tok.vocab_size} tokens but the model only {cfg.vocab_size}"
        )
    return Model.from_tensors(cfg, tensors, gemm, consume=True), tok, cfg.eos_token_ids


def load_models(settings: SessionSettings) -> Loaded:
    device = _device(settings)
    dtype = _dtype(settings, device)
    gemm = gemm_backends.resolve(settings.gemm_backend, device)
    target_path = settings.model
    if target_path is None and settings.preset is None:
        target_path = default_checkpoint("target")
        if not (target_path / "config.json").exists():
            raise CheckpointError(f"embedded default model missing at {target_path}; pass --model")
    target, tok, eos = _load_one(target_path, settings.preset, dtype, device, gemm, settings.seed)
    if device.type == "cpu" and target.cfg.num_params() < SMALL_MODEL_PARAMS:
        # Small ops gain nothing from intra-op threads and lose a lot when cores are
        # shared (OpenMP barriers): measured 3.0 ms vs 22 ms per decode step under load.
        torch.set_num_threads(1)
    desc = {"model": str(target_path or settings.preset), "drafter": settings.drafter}
    loaded = Loaded(target, None, tok, eos, desc)
    if settings.drafter == "model" and settings.speculation:
        load_draft(settings, loaded)
    return loaded


def load_draft(settings: SessionSettings, loaded: Loaded) -> None:
    """The draft model into `loaded` (at the start, or when speculation is switched on in a
    session that started without it), on the target's device, dtype and GEMM backend."""
    target = loaded.target
    draft_path = settings.draft
    if draft_path is None:
        if settings.model is not None or settings.preset is not None:
            raise UsageError("--drafter model needs --draft DIR (or use --drafter ngram)")
        draft_path = default_checkpoint("draft")
    draft, draft_tok, _ = _load_one(
        draft_path, None, target.dtype, target.device, target.gemm, settings.seed
    )
    if draft_tok != loaded.tokenizer:
        target_path = loaded.description["model"]
        raise CheckpointError(
            f"{draft_path}: draft tokenizer differs from the target's ({target_path})"
        )
    loaded.draft = draft
    loaded.description["draft"] = str(draft_path)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("specdash", "triton", "textual", "pydantic"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


@dataclass(slots=True)
class InFlight:
    """A sequence being decoded and what its `PromptDone` will say."""

    seq: Sequence
    decode_s: float = 0.0
    """Draft + verify + rollback seconds (prefill and the shadow excluded)."""
    verify_steps: list[VerifyStep] = field(default_factory=list)
    """Its verify steps; plain decode steps (speculation off) are left out."""
    skipped: bool = False
    """`n` cut it short."""


class SessionRunner:
    """One session's loop. Separate from `NativeRunner` so tests can reach the engine."""

    def __init__(
        self,
        settings: SessionSettings,
        sink: Sink,
        controls: Controls | None = None,
        stop: threading.Event | None = None,
        loaded: Loaded | None = None,
    ) -> None:
        self.settings = settings
        self.loaded = loaded or load_models(settings)
        self.events = SessionEvents(settings, sink)
        self.stats = self.events.stats
        self.emit = self.events.emit
        self.controls = controls or Controls.from_settings(settings, self.loaded.target.gemm.name)
        self.stop = stop or threading.Event()
        self.applied = self.controls.snapshot()
        self.step_no = 0
        self._next_index = 0  # prompt index for prompts typed in the dashboard
        self._group: list[Sequence] = []  # the sequences being decoded now
        self.engine = Engine(self.loaded.target, self._make_drafter, self.loaded.eos_ids)

    def _make_drafter(self) -> Drafter:
        if self.settings.drafter == "model" and self.loaded.draft is not None:
            return ModelDrafter(self.loaded.draft)
        # --drafter model with speculation off: a stand-in never asked for drafts;
        # `_switch_drafts_on` loads the draft and replaces it before the first one
        return NgramDrafter()

    def _switch_drafts_on(self) -> bool:
        """Speculation switched on: with --drafter model and no draft loaded yet (the session
        started with speculation off), load it and give every live sequence a model drafter.
        A draft that cannot load keeps speculation off, with a non-fatal error saying why."""
        if self.settings.drafter != "model" or self.loaded.draft is not None:
            return True
        try:
            with torch.inference_mode(
                False
            ):  # weights as at the start: the GEMM caches version them
                load_draft(self.settings, self.loaded)
        except SpecdashError as e:
            self.emit(
                EngineError(
                    message=f"speculation stays off: the draft model did not load: {e}",
                    fatal=False,
                    exit_code=e.exit_code,
                )
            )
            return False
        for seq in self._group:
            seq.drafter = ModelDrafter(self.loaded.draft)  # type: ignore[arg-type]
            seq.drafter.start(seq.prompt, seq.capacity)
        return True

    def _apply_controls(self) -> None:
        """Pick up control changes between steps; each change is itself an event.

        A pause is recorded before the engine blocks on it and again on resume, so traces
        and replays show it.
        """
        new = self.controls.snapshot()
        if new.paused:
            self._take(new)
            self.controls.wait_while_paused(self.stop)
            new = self.controls.snapshot()
        self._take(new)

    def _take(self, new: ControlState) -> None:
        if new == self.applied:
            return
        if new.speculation and not self.applied.speculation and not self._switch_drafts_on():
            new = self.controls.update(speculation=False)
        if new.gemm_backend != self.applied.gemm_backend:
            try:
                backend = gemm_backends.resolve(new.gemm_backend, self.loaded.target.device)
            except SpecdashError as e:  # an unavailable backend is refused, not fatal
                self.emit(EngineError(message=str(e), fatal=False))
                new = self.controls.update(gemm_backend=self.applied.gemm_backend)
            else:
                self.loaded.target.gemm = backend
                if self.loaded.draft is not None:
                    self.loaded.draft.gemm = backend
        for name in ("gemm_backend", "speculation", "k", "verify_mode", "paused"):
            old_v, new_v = getattr(self.applied, name), getattr(new, name)
            if old_v != new_v:
                self.emit(
                    ControlChange(
                        name=name, old=str(old_v), new=str(new_v), applied_step=self.step_no
                    )
                )
        self.applied = new

    def _encode(self, name: str, text: str) -> list[int]:
        s = self.settings
        ids = self.loaded.tokenizer.encode(text)
        if not ids:
            raise UsageError(f"prompt {name!r} is empty after tokenization")
        limit = self.loaded.target.cfg.max_position_embeddings
        need = len(ids) + s.max_new_tokens - 1  # the last generated token is never fed
        if need > limit:
            raise UsageError(
                f"prompt {name!r} is {len(ids)} tokens; with --max-new-tokens "
                f"{s.max_new_tokens} it needs {need} positions, the model has {limit}"
            )
        return ids

    def _next_group(self, queue: deque[Queued]) -> list[Queued]:
        """Up to `batch` prompts: typed ones (dashboard) first, then the prompt set's."""
        group: list[Queued] = []
        while len(group) < self.settings.batch:
            typed = self.controls.take_user_prompt()
            if typed is not None:
                index = self._next_index
                self._next_index += 1
                try:
                    group.append((index, typed, self._encode(f"typed-{index}", typed)))
                except UsageError as e:  # a bad typed prompt must not end the session
                    self.emit(EngineError(message=str(e), fatal=False))
            elif queue:
                group.append(queue.popleft())
            else:
                break
        return group

    def run(self) -> Summary:
        s = self.settings
        prompts = load_prompts(s.prompts)
        queue = deque((i, p.text, self._encode(p.name, p.text)) for i, p in enumerate(prompts))
        self._next_index = len(prompts)
        # state slots sized for the longest prompt, allocated once: RSS stays at its level
        self.engine.reserve(
            max(len(q[2]) for q in queue), s.max_new_tokens, MAX_K, s.batch, s.shadow
        )
        device = self.loaded.target.device
        self.events.session_start(
            {
                "loaded": self.loaded.description,
                "gemm_backends": {
                    name: b.unavailable for name, b in gemm_backends.backends(device).items()
                },
            },
            versions(),
            device_name(device),
            self.loaded.target.gemm.name,
        )
        with torch.inference_mode():
            while not self.stop.is_set():
                if group := self._next_group(queue):
                    self._run_group(group)
                elif self.controls.stay_open:  # the dashboard: wait for a typed prompt
                    self.emit(Idle())
                    trim_heap()  # the last group's caches, while nothing runs
                    self.controls.wait_for_prompt(self.stop)
                else:
                    break
        trim_heap()  # the last group's caches: the dashboard stays open after the session
        return self.events.finish()

    def _run_group(self, group: list[Queued]) -> None:
        """Decode `group` together: prefill each, step them in turn until every one is done
        (or the dashboard asks for the next prompt, or the session stops), then finish each."""
        flights = [self._start(index, text, ids) for index, text, ids in group]
        self._group = [f.seq for f in flights]
        trim_heap()  # the prefills' freed activations back to the OS, or RSS keeps them
        while active := self._active(flights):
            st = self.applied
            k = st.k if st.speculation else 0
            for flight, before, result in self._step(active, k, st.verify_mode):
                self._emit_step(flight, before, result, k, st.verify_mode)
            self.step_no += 1
        for flight in flights:
            self._finish(flight)

    def _start(self, index: int, text: str, ids: list[int]) -> InFlight:
        """Prefill one prompt (the shadow shares it); its first token comes from the prefill."""
        s = self.settings
        self.emit(PromptStart(prompt_index=index, prompt_tokens=len(ids), text=text))
        seq, prefill_s = self.engine.start(index, ids, s.max_new_tokens, MAX_K, s.shadow)
        self.emit(Prefill(prompt_index=index, tokens=len(ids), seconds=prefill_s, run="spec"))
        self._emit_tokens(seq, 0, "decode", 0)
        return InFlight(seq)

    def _active(self, flights: list[InFlight]) -> list[InFlight]:
        """Between steps: apply the controls, then the sequences still decoding (none when the
        session stops or the dashboard asks for the next prompt)."""
        if self.stop.is_set():
            return []
        self._apply_controls()
        if self.controls.take_next_prompt_request():
            for flight in flights:
                if not flight.seq.done:
                    flight.skipped = True
                    self.emit(ControlChange(name="prompt", old=str(flight.seq.index),
                                            new="skipped", applied_step=self.step_no))  # fmt: skip
            return []
        return [f for f in flights if not f.seq.done]

    def _step(
        self, active: list[InFlight], k: int, mode: str
    ) -> Iterator[tuple[InFlight, int, StepResult]]:
        """One step of every active sequence, in one batched forward (GEMMs over all their
        rows; attention and GDN per sequence on its own state): the one place the engine steps
        sequences. Each is yielded with its length before the step."""
        befores = [len(f.seq.ids) for f in active]
        seqs = [f.seq for f in active]
        results = self.engine.spec_step(seqs, k, mode, self.settings.max_new_tokens)  # type: ignore[arg-type]
        yield from zip(active, befores, results, strict=True)

    def _emit_step(self, flight: InFlight, before: int, r: StepResult, k: int, mode: str) -> None:
        """A step's events: the drafts, the verify step, the tokens it emitted, and any
        divergence among them."""
        seq = flight.seq
        flight.decode_s += r.draft_s + r.verify_s + r.rollback_s
        if k:
            self.emit(
                Draft(
                    prompt_index=seq.index,
                    step=self.step_no,
                    k=k,
                    drafter=self.settings.drafter,
                    tokens=r.drafts,
                    seconds=r.draft_s,
                )
            )
        step = VerifyStep(
            prompt_index=seq.index,
            step=self.step_no,
            k=k,
            accepted=r.accepted,
            draft_tokens=r.drafts,
            emitted_tokens=r.emitted,
            verify_mode=mode,  # type: ignore[arg-type]
            gemm_backend=self.engine.target.gemm.name,
            draft_s=r.draft_s,
            verify_s=r.verify_s,
            shadow_s=r.shadow_s,
            rollback_s=r.rollback_s,
        )
        self.emit(step)
        if not step.plain:
            flight.verify_steps.append(step)
        self._emit_tokens(seq, before, "draft", r.accepted)
        for pos in divergences_to_report(seq.diverged_at, seq.text_diverged_at):
            if pos >= before:
                self._emit_divergence(seq, k, pos)

    def _finish(self, flight: InFlight) -> None:
        seq, verified = flight.seq, flight.verify_steps
        self.events.prompt_done(
            seq.index,
            new_tokens=len(seq.ids),
            seconds=flight.decode_s,
            verify_steps=len(verified),
            accepted_drafts=sum(v.accepted for v in verified),
            proposed_drafts=sum(v.proposed for v in verified),
            checked=self.settings.shadow,
            bits_at=seq.diverged_at,
            text_at=seq.text_diverged_at,
            compared_all=seq.compared == len(seq.ids),
            skipped=flight.skipped,
        )
        self.engine.release(seq)

    def _emit_tokens(self, seq: Sequence, start: int, source: str, accepted: int) -> None:
        tok = self.loaded.tokenizer
        for j in range(start, len(seq.ids)):
            src = source if source == "decode" or j - start < accepted else "bonus"
            self.emit(
                Token(
                    prompt_index=seq.index,
                    position=j,
                    token_id=seq.ids[j],
                    logprob=seq.logprobs[j],
                    text=tok.decode([seq.ids[j]]),
                    source=src,
                    step=self.step_no,
                )
            )  # type: ignore[arg-type]

    def _emit_divergence(self, seq: Sequence, k: int, j: int) -> None:
        """Generated token j differs from the shadow's: the first bit divergence, or the first
        token-id divergence when that comes later (root cause only for the first)."""
        tok = self.loaded.tokenizer
        first = j == seq.diverged_at
        cause = find_root_cause(self.engine, seq, j) if self.settings.root_cause and first else None
        step, _ = self.engine.step_of(seq, j)
        end = len(seq.prompt) + j  # the context: up to 24 tokens before token j
        self.events.divergence(
            seq.index,
            j,
            step=self.step_no,
            k=k,
            verify_mode=seq.steps[step].mode,
            gemm_backend=seq.steps[step].gemm.name,
            spec=(seq.ids[j], seq.logprobs[j], tok.decode([seq.ids[j]])),
            shadow=(seq.shadow_ids[j], seq.shadow_logprobs[j], tok.decode([seq.shadow_ids[j]])),
            context=tok.decode((seq.prompt + seq.ids)[max(0, end - 24) : end]),
            root_cause=cause,
            margin=self._shadow_margin(seq, j),
        )

    def _shadow_margin(self, seq: Sequence, j: int) -> Margin | None:
        """The shadow's top-1 / top-2 at generated token j, from the logprob row it chose
        token j from (the engine keeps it where the runs first diverge)."""
        row = seq.shadow_rows.get(j)
        if row is None:
            return None
        values, ids = row.float().topk(2)
        (v1, v2), (i1, i2) = values.tolist(), ids.tolist()
        dtype = str(self.loaded.target.dtype).removeprefix("torch.")
        return shadow_margin((i1, v1), (i2, v2), dtype)


class NativeRunner:
    """specdash's own engine as a `Runner`. `loaded`: weights shared across sessions (the
    audit's cells, benchmarks); None loads them per session."""

    def __init__(self, loaded: Loaded | None = None) -> None:
        self.loaded = loaded

    def run(
        self,
        settings: SessionSettings,
        sink: Sink,
        controls: Controls | None = None,
        stop: threading.Event | None = None,
    ) -> Summary:
        return SessionRunner(settings, sink, controls, stop, self.loaded).run()


run_session = NativeRunner().run
"""A session on the native engine, weights loaded for it: the one-call form."""
