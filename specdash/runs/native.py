"""specdash's own engine as a session backend: one verify step of every prompt in flight per
step, in one batched forward, the shadow advancing in the same step.

`native_session` builds the `Session` where a caller wants the engine at hand or weights shared
across sessions (the audit, tests, benchmarks); `specdash.runs.runner.run_engine` is the plain
way to run one.
"""

from __future__ import annotations

import contextlib
import platform
import threading
from collections.abc import Iterator
from importlib import metadata

import torch

from specdash.controls import Controls, ControlState
from specdash.engine.drafters import Drafter, NgramDrafter
from specdash.engine.engine import Engine, Sequence, StepResult
from specdash.engine.loader import Loaded, load_draft, load_models
from specdash.engine.root_cause import RootCauseFinder
from specdash.errors import EnvironmentProblem, SpecdashError, UsageError
from specdash.events import (
    Draft,
    EngineError,
    GemmChoice,
    Margin,
    Prefill,
    Sink,
    Token,
    TokenSource,
    VerifyStep,
)
from specdash.kernels import gemm_backends
from specdash.prompts import Prompt
from specdash.registry import drafters
from specdash.runs.session import Evidence, Flight, Header, Session
from specdash.settings import MAX_K, SessionSettings


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


class NativeBackend:
    """The native engine under a `Session` (the `specdash.runs.session.Backend` protocol).
    `loaded`: weights shared across sessions (the audit's cells, benchmarks); None loads them
    when the session opens."""

    def __init__(self, settings: SessionSettings, loaded: Loaded | None = None) -> None:
        self.settings = settings
        self.loaded = loaded or load_models(settings)
        self.engine = Engine(self.loaded.target, self._make_drafter, self.loaded.eos_ids)
        self.root_causes = RootCauseFinder(self.engine)
        self.seqs: dict[int, Sequence] = {}
        """The engine's sequence of each prompt in flight, by prompt index."""
        self._emit: Sink = lambda event: None
        self._step = 0
        """The session's step now: where a divergence found after it is reported."""
        self._k = 0
        """Drafts asked for in that step (0: a plain decode step)."""
        self._longest = (0, "")
        """The longest prompt encoded so far: (tokens, name)."""

    def _make_drafter(self) -> Drafter:
        entry = drafters.drafter(self.settings.drafter)
        if not entry.draft_model:
            drafter: Drafter = entry.load()()
            return drafter
        if self.loaded.draft is not None:
            drafter = entry.load()(self.loaded.draft)
            return drafter
        # a draft model's drafter with speculation off: a stand-in never asked for drafts;
        # `_switch_drafts_on` loads the draft and replaces it before the first one
        return NgramDrafter()

    def open(
        self, prompts: list[Prompt], emit: Sink, stack: contextlib.ExitStack
    ) -> tuple[Header, list[list[int]]]:
        s = self.settings
        self._emit = emit
        encoded = [self.encode(p.name, p.text) for p in prompts]
        # state slots sized for the longest prompt, allocated once: RSS stays at its level; no
        # more than the prompts can fill (a prompt typed later gets a slot when it starts)
        in_flight = min(s.batch, len(encoded))
        self.engine.reserve(max(map(len, encoded)), s.max_new_tokens, MAX_K, in_flight, s.shadow)
        stack.enter_context(torch.inference_mode())
        target = self.loaded.target
        header = Header(
            gemm_backend=target.gemm.name,
            gemm_backends=[
                GemmChoice(name=name, unavailable=b.unavailable)
                for name, b in gemm_backends.backends(target.device).items()
            ],
            speculative_algorithm=drafters.algorithm(s.drafter),
            checked=s.shadow,
            versions=versions(),
            device=device_name(target.device),
            config={
                "loaded": self.loaded.description,
                "gemm_kernel": gemm_backends.exact_kernel(target.gemm, target.dtype),
            },
        )
        return header, encoded

    def encode(self, name: str, text: str) -> list[int]:
        ids = self.loaded.tokenizer.encode(text)
        if not ids:
            raise UsageError(f"prompt {name!r} is empty after tokenization")
        self._check_positions(name, len(ids))
        self._longest = max(self._longest, (len(ids), name))
        return ids

    def _check_positions(self, name: str, tokens: int) -> None:
        """Refuse a prompt that needs more positions than a model has (its RoPE table and
        caches end there), naming that checkpoint. The target is fed every position but the
        last generated token's; the draft the prompt, then one fewer (it drafts only while two
        tokens are left and never feeds its last proposal)."""
        loaded, new = self.loaded, self.settings.max_new_tokens
        needs = [("target", loaded.target, loaded.description["model"], tokens + new - 1)]
        if loaded.draft is not None:
            draft_need = tokens + max(new - 2, 0)
            needs.append(("draft", loaded.draft, loaded.description["draft"], draft_need))
        for role, model, where, need in needs:
            limit = model.cfg.max_position_embeddings
            if need > limit:
                raise UsageError(
                    f"prompt {name!r} is {tokens} tokens; with at most {new} new tokens it "
                    f"needs {need} positions, the {role} model ({where}) has {limit}"
                )

    def prefill(self, flight: Flight, step: int) -> None:
        """Prefill one prompt (the shadow shares it); its first token comes from the prefill."""
        s = self.settings
        seq, prefill_s = self.engine.start(
            flight.index, flight.prompt, s.max_new_tokens, MAX_K, s.shadow
        )
        self.seqs[flight.index] = seq
        tokens = len(flight.prompt)
        self._emit(Prefill(prompt_index=flight.index, tokens=tokens, seconds=prefill_s, run="spec"))
        self._sync(flight, seq)
        self._emit_tokens(flight, seq, 0, None, step)

    def step(self, flights: list[Flight], controls: ControlState, step: int) -> Iterator[Flight]:
        """One step of every flight, in one batched forward (GEMMs over all their rows;
        attention and GDN per sequence on its own state); each flight's events: the drafts, the
        verify step and the tokens it emitted."""
        self._step, self._k = step, controls.k if controls.speculation else 0
        seqs = [self.seqs[f.index] for f in flights]
        befores = [len(seq.ids) for seq in seqs]
        results = self.engine.spec_step(
            seqs, self._k, controls.verify_mode, self.settings.max_new_tokens
        )
        for flight, seq, before, r in zip(flights, seqs, befores, results, strict=True):
            self._emit_step(flight, seq, before, r, controls)
            yield flight

    def _emit_step(
        self,
        flight: Flight,
        seq: Sequence,
        before: int,
        r: StepResult,
        controls: ControlState,
    ) -> None:
        """A step's events: the drafts, the verify step and the tokens it emitted."""
        k, step_no = self._k, self._step
        flight.decode_s += r.draft_s + r.verify_s + r.rollback_s
        flight.shadow_s += r.shadow_s
        if k:
            self._emit(
                Draft(
                    prompt_index=flight.index,
                    step=step_no,
                    k=k,
                    drafter=self.settings.drafter,
                    tokens=r.drafts,
                    seconds=r.draft_s,
                )
            )
        step = VerifyStep(
            prompt_index=flight.index,
            step=step_no,
            k=k,
            accepted=r.accepted,
            draft_tokens=r.drafts,
            emitted_tokens=r.emitted,
            verify_mode=controls.verify_mode,
            gemm_backend=self.engine.target.gemm.name,
            draft_s=r.draft_s,
            verify_s=r.verify_s,
            shadow_s=r.shadow_s,
            rollback_s=r.rollback_s,
        )
        self._emit(step)
        if not step.plain:
            flight.verify_steps += 1
            flight.accepted_drafts += step.accepted
            flight.proposed_drafts += step.proposed
        self._sync(flight, seq)
        self._emit_tokens(flight, seq, before, r.accepted, step_no)

    @staticmethod
    def _sync(flight: Flight, seq: Sequence) -> None:
        """The flight's view of both runs: the engine's own lists."""
        flight.ids, flight.logprobs = seq.ids, seq.logprobs
        flight.shadow_ids, flight.shadow_logprobs = seq.shadow_ids, seq.shadow_logprobs
        flight.done = seq.done

    def _emit_tokens(
        self, flight: Flight, seq: Sequence, start: int, accepted: int | None, step: int
    ) -> None:
        """Tokens `start`.. of `seq`: the prefill's (`accepted` None), or a step's accepted
        drafts and its bonus token."""
        tok = self.loaded.tokenizer
        for j in range(start, len(seq.ids)):
            source: TokenSource = "decode"
            if accepted is not None:
                source = "draft" if j - start < accepted else "bonus"
            self._emit(
                Token(
                    prompt_index=flight.index,
                    position=j,
                    token_id=seq.ids[j],
                    logprob=seq.logprobs[j],
                    text=tok.decode([seq.ids[j]]),
                    source=source,
                    step=step,
                )
            )

    def late_shadows(self, flights: list[Flight]) -> Iterator[Flight]:
        return iter(())  # the shadow advances in every step

    def evidence(self, flight: Flight, position: int, first: bool) -> Evidence:
        """With the root cause of the first (the sub-op whose bits differ first), from the
        step that emitted the token as it ran."""
        seq, tok = self.seqs[flight.index], self.loaded.tokenizer
        cause = None
        if self.settings.root_cause and first:
            cause = self.root_causes.find(seq, position)
        record = seq.steps[self.engine.step_of(seq, position)[0]]
        assert record.mode != "prefill", "a verify step's mode is a verify mode"
        spec, shadow = seq.ids[position], seq.shadow_ids[position]
        return Evidence(
            spec=(spec, seq.logprobs[position]),
            shadow=(shadow, seq.shadow_logprobs[position]),
            texts=(tok.decode([spec]), tok.decode([shadow])),
            context=tok.decode(flight.context(position)),
            step=self._step,
            k=self._k,
            verify_mode=record.mode,
            gemm_backend=record.gemm.name,
            root_cause=cause,
            margin=self._shadow_margin(seq, position),
        )

    def _shadow_margin(self, seq: Sequence, position: int) -> Margin | None:
        """The shadow's top-1 / top-2 at `position`, from the logprob row it chose that token
        from (the engine keeps it where the runs first diverge)."""
        row = seq.shadow_rows.get(position)
        if row is None:
            return None
        values, ids = row.float().topk(2)
        (v1, v2), (i1, i2) = values.tolist(), ids.tolist()
        dtype = str(self.loaded.target.dtype).removeprefix("torch.")
        return Margin.between((i1, v1), (i2, v2), dtype)

    def apply(self, name: str, value: object) -> bool:
        if name == "speculation" and value:
            return self._switch_drafts_on()
        if name == "gemm_backend":
            try:
                backend = gemm_backends.resolve(str(value), self.loaded.target.device)
                if backend.fp8 is None and self.loaded.target.has_fp8:
                    raise EnvironmentProblem(
                        f"GEMM backend {backend.name!r} runs no FP8 weights; triton-fp8 does"
                    )
            except SpecdashError as e:  # an unavailable backend is refused, not fatal
                self._emit(EngineError(message=str(e), fatal=False))
                return False
            self.loaded.target.gemm = backend
            if self.loaded.draft is not None:
                self.loaded.draft.gemm = backend
        return True  # k, verify mode, speculation off: read by the next step

    def _switch_drafts_on(self) -> bool:
        """Speculation switched on: with --drafter model and no draft loaded yet (the session
        started with speculation off), load it and give every live sequence a model drafter.
        A draft that cannot load keeps speculation off, with a non-fatal error saying why."""
        if not drafters.uses_draft_model(self.settings.drafter) or self.loaded.draft is not None:
            return True
        try:
            with torch.inference_mode(False):  # as at the start: the GEMM caches version weights
                load_draft(self.settings, self.loaded)
            if self._longest[0]:  # the session's prompts must fit the draft too
                self._check_positions(self._longest[1], self._longest[0])
        except SpecdashError as e:
            self.loaded.draft = None
            self.loaded.description.pop("draft", None)
            self._emit(
                EngineError(
                    message=f"speculation stays off: the draft model did not load: {e}",
                    fatal=False,
                    exit_code=e.exit_code,
                )
            )
            return False
        assert self.loaded.draft is not None
        for seq in self.seqs.values():
            seq.drafter = self._make_drafter()
            seq.drafter.start(seq.prompt, seq.capacity)
        return True

    def release(self, flight: Flight) -> None:
        self.engine.release(self.seqs.pop(flight.index))


def backend(settings: SessionSettings, options: object = None) -> NativeBackend:
    """The native engine's entry in `specdash.registry.engines`: it needs no options beyond
    the settings."""
    return NativeBackend(settings)


def native_session(
    settings: SessionSettings,
    sink: Sink,
    controls: Controls | None = None,
    stop: threading.Event | None = None,
    loaded: Loaded | None = None,
) -> Session:
    """A session on the native engine; `session.backend.engine` is its engine."""
    return Session(settings, NativeBackend(settings, loaded), sink, controls, stop)
