"""SGLang as a session backend: a patched `sglang.Engine` in this process runs the speculative
requests, a second engine without speculation the shadow.

A step is one batch of requests run to the end: `--batch N` sends N prompts to the speculative
engine at once (one `generate` call with N prompts, which SGLang schedules together), while the
telemetry thread turns each request's verify steps (by request id) into `VerifyStep` events as
they happen. The shadow then decodes each prompt alone, one request at a time: batch-1 plain
decoding is the reference every request is compared with, ids and fp32 logprob bits.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TextIO

from specdash.controls import ControlState
from specdash.errors import EnvironmentProblem
from specdash.events import EngineError, GemmChoice, Margin, Sink, Token
from specdash.prompts import Prompt
from specdash.runs.session import Evidence, Flight, Header
from specdash.runs.sglang import preflight, process, quantization
from specdash.runs.sglang.args import SGLangOptions, applied_patches, engine_kwargs
from specdash.runs.sglang.host import EngineHost
from specdash.runs.sglang.patches import gemm_routing
from specdash.runs.sglang.patches.registry import sglang_version
from specdash.runs.sglang.process import SGLangEngine
from specdash.runs.sglang.start import StartWatch
from specdash.runs.sglang.telemetry import TelemetryReceiver, token_sources, verify_step_event
from specdash.settings import SessionSettings

SHADOW_TOP_LOGPROBS = 2
"""Top logprobs per token the shadow's request asks for: its top-1 / top-2 margin at a
divergence. Only the shadow asks: the speculative request stays as it was, so its speed does
not move (the top-k is an extra kernel and host copy per step, never a change to the argmax or
to the emitted token's logprob, which SGLang gathers from the same log-softmax row)."""


@dataclass
class _Output:
    """One request's output: ids, and per token its logprob and text where SGLang gave them,
    and its top (token id, logprob) pairs, best first, where the request asked for them."""

    ids: list[int]
    logprobs: list[float | None]
    texts: list[str]
    meta: dict[str, Any]
    top: list[list[tuple[int, float]]]


def generate(
    engine: SGLangEngine,
    texts: list[str],
    rids: list[str],
    max_new_tokens: int,
    top_logprobs: int | None = None,
) -> list[_Output]:
    """Greedy decoding of `texts` as one batch of requests (ids `rids`), with logprobs, and
    the `top_logprobs` best per token where asked (None: SGLang's default, none)."""
    outs = engine.generate(
        prompt=texts,
        sampling_params={"temperature": 0.0, "max_new_tokens": max_new_tokens},
        return_logprob=True,
        rid=rids,
        top_logprobs_num=top_logprobs,
    )
    results = []
    for out in outs:
        meta = out["meta_info"]
        ids = [int(t) for t in out["output_ids"]]
        triples = meta.get("output_token_logprobs") or []
        missing = len(ids) - len(triples)
        # per token a list of (logprob, token id, text) best first, or None: SGLang's format
        tops = meta.get("output_top_logprobs") or []
        results.append(
            _Output(
                ids=ids,
                logprobs=[lp for lp, _, _ in triples] + [None] * missing,
                texts=[tx or "" for _, _, tx in triples] + [""] * missing,
                meta=meta,
                top=[[(int(t), lp) for lp, t, _ in row or ()] for row in tops]
                + [[] for _ in range(len(ids) - len(tops))],
            )
        )
    return results


WARM_UP_TEXT = "specdash warms the engine up: this request's kernels compile before timing."
WARM_UP_PHASE = "warm-up request (a cold Triton cache compiles its kernels here)"


def warm_up(engine: SGLangEngine, k: int, requests: int = 1) -> None:
    """Short requests through `engine` before the session's clock starts: on a machine's
    first session SGLang's Triton kernels (prefill, verify, draft) compile inside the first
    request, which would make the first rate a user sees 3-6x low (60 against 380 tok/s on an
    H100). As many requests at once as the session sends (`requests`): a prefill of several
    sequences is slow the first time too (a `--batch 8` session's first 7-sequence prefill ran
    at 7.9k tok/s on a machine where every later one ran at 66-74k, H100).
    Their k + 2 tokens reach a verify step. Their texts differ from the first token on, so
    SGLang prefills them together rather than one after another on a shared prefix. The
    prefix cache is flushed after them, so no prompt of the session starts from the warm-up's
    cached tokens in one engine and not the other."""
    texts = warm_up_texts(requests)
    rids = [f"specdash-warm-up-{uuid.uuid4().hex[:8]}" for _ in texts]
    generate(engine, texts, rids, k + 2)
    engine.flush_cache()


def warm_up_texts(requests: int) -> list[str]:
    """The warm-up's prompts: WARM_UP_TEXT alone, or numbered in front for several."""
    return [WARM_UP_TEXT] if requests == 1 else [f"{i}. {WARM_UP_TEXT}" for i in range(requests)]


@dataclass
class _Request:
    """What the backend keeps of a prompt until its verdict."""

    accepted: list[int] = field(default_factory=list)
    """Accepted drafts per verify step, as the telemetry reported them."""
    texts: list[str] = field(default_factory=list)
    shadow_texts: list[str] = field(default_factory=list)
    cached: int | None = None
    shadow_cached: int | None = None
    """Prompt tokens each engine read from its prefix cache (SGLang's `cached_tokens`)."""
    shadow_top: list[list[tuple[int, float]]] = field(default_factory=list)
    """The shadow's top (token id, logprob) pairs per token, best first."""
    step: int = 0
    """The session step whose batch of requests runs it (a step is a batch run to the end)."""


class SGLangBackend:
    """SGLang engines under a `Session` (the `specdash.runs.session.Backend` protocol)."""

    def __init__(self, settings: SessionSettings, options: SGLangOptions) -> None:
        self.settings, self.options = settings, options
        speculative = settings.speculation
        self.compare = settings.shadow and speculative
        self.split = self.compare and options.shadow_mode == "split"
        self.spec_kwargs = engine_kwargs(
            settings, options, speculative=speculative, split=self.split, requests=settings.batch
        )
        self.shadow_kwargs = engine_kwargs(settings, options, speculative=False, split=self.split)
        self.log_file = options.log_file or process.log_file_beside(settings)
        self.gemm_backend = "auto"
        self.dtype = ""
        """What the model computes in (`process.engine_dtype`), read when the engines start."""
        self.requests: dict[int, _Request] = {}
        self._spec: SGLangEngine | None = None
        self._shadow: SGLangEngine | None = None
        self._receiver: TelemetryReceiver | None = None
        self._emit: Sink = lambda event: None
        self._stack = contextlib.ExitStack()
        self._engines = contextlib.ExitStack()
        self._parent_log: TextIO | None = None
        self._tokenizer: process.Tokenizer | None = None

    def open(
        self, prompts: list[Prompt], emit: Sink, stack: contextlib.ExitStack
    ) -> tuple[Header, list[list[int]]]:
        self._emit, self._stack = emit, stack
        engines = [self.spec_kwargs, self.shadow_kwargs] if self.compare else [self.spec_kwargs]
        row = preflight.check_startable(self.options, engines)
        self._receiver = receiver = TelemetryReceiver()
        stack.callback(receiver.close)
        stack.enter_context(
            process.session_environment(
                applied_patches(self.options), receiver.address, self.log_file, self.split, row
            )
        )
        self._engines = stack.enter_context(contextlib.ExitStack())
        # split: the shadow starts in its host process while the spec engine starts here
        shadow_ready = self._engines.enter_context(self._hosted()) if self.split else None
        name = "spec" if self.settings.speculation else "plain"
        self._spec = self._engines.enter_context(
            self._engine(self.spec_kwargs, name, requests=self.settings.batch)
        )
        self._shadow = shadow_ready() if shadow_ready is not None else None
        # the shadow's too: both engines take the same checkpoint and dtype arguments
        self.dtype = process.engine_dtype(self._spec)
        # kept past the spec engine's shutdown: the sequential shadow's texts need it too
        self._tokenizer = process.engine_tokenizer(self._spec)
        self._switch_gemm(self.settings.gemm_backend)
        return self._header(), [self.encode(p.name, p.text) for p in prompts]

    def _header(self) -> Header:
        import torch

        config = {
            "sglang_args": {k: repr(v) for k, v in self.options.engine_args.items()},
            "shadow_mode": self.options.shadow_mode,
            "sglang_patches": applied_patches(self.options),
        }
        cuda = torch.cuda.is_available()
        # without the routing patch SGLang's own GEMMs run, and nothing switches them
        routes = {"auto": None} if "gemm" in self.options.unpatch else gemm_routing.routes()
        return Header(
            gemm_backend=self.gemm_backend,
            gemm_backends=[GemmChoice(name=name, unavailable=why) for name, why in routes.items()],
            speculative_algorithm=(
                self.options.speculative_algorithm if self.settings.speculation else None
            ),
            quantization=quantization.described(self.spec_kwargs),
            checked=self.compare,
            # SGLang prefills inside each request and reports no first-token time, so a
            # request's seconds, which the rates divide by, hold its prefill
            rate_includes_prefill=True,
            versions={"sglang": sglang_version() or "?", "torch": torch.__version__},
            device=f"cuda {torch.cuda.get_device_name()}" if cuda else "no CUDA",
            config=config,
        )

    @contextlib.contextmanager
    def _engine(
        self, kwargs: dict[str, Any], name: str, requests: int = 1
    ) -> Iterator[SGLangEngine]:
        """An engine of this process, its start phases read from the session's log, warmed up
        with `requests` requests at once (`warm_up`). SGLang's logging in this process goes
        to that log too: its `basicConfig` handler binds the `sys.stderr` of the moment, here
        the log file, which stays open for the process's life (the handler writes to it after
        the engine has shut down)."""
        if self._parent_log is None:
            self._parent_log = self.log_file.open("a", encoding="utf-8", buffering=1)
        with (
            StartWatch(self.log_file, name, self._emit) as watch,
            contextlib.redirect_stderr(self._parent_log),
        ):
            engine = process.start_engine(kwargs)
            try:
                watch.mark(WARM_UP_PHASE)
                warm_up(engine, self.settings.k, requests)
            except BaseException:
                engine.shutdown()
                raise
        try:
            yield engine
        finally:
            engine.shutdown()

    @contextlib.contextmanager
    def _hosted(self) -> Iterator[Callable[[], EngineHost]]:
        """The shadow engine starting in its host process; the callable waits until it has
        started and returns it."""
        log = process.shadow_log(self.log_file)
        watch = StartWatch(log, "shadow", self._emit)
        watch.start()
        with process.host_environment(log) as env:
            start = partial(process.start_engine, engine_class=process.patched_engine_class)
            host = EngineHost(self.shadow_kwargs, env, log, start)

            def ready() -> EngineHost:
                try:
                    host.wait_ready()
                    watch.mark(WARM_UP_PHASE)
                    warm_up(host, self.settings.k)
                except BaseException:
                    watch.finish(ok=False)
                    raise
                watch.finish(ok=True)
                return host

            try:
                yield ready
            finally:
                watch.finish(ok=False)
                host.shutdown()

    def encode(self, name: str, text: str) -> list[int]:
        """The prompt's ids as the engine's tokenizer reads them (SGLang checks the length)."""
        return self._tokenizer.encode(text) if self._tokenizer is not None else []

    def _texts(self, out: _Output) -> list[str]:
        """Each output token's text, decoded alone by the engine's tokenizer: SGLang leaves
        the text in its logprob triples empty unless a request asks for it, which
        `Engine.generate` cannot (no stand-in tokenizer: the texts the engine gave)."""
        if self._tokenizer is None:
            return out.texts
        return [self._tokenizer.decode([i]) for i in out.ids]

    def prefill(self, flight: Flight, step: int) -> None:
        self.requests[flight.index] = _Request(step=step)  # SGLang prefills inside the request

    def step(self, flights: list[Flight], controls: ControlState, step: int) -> Iterator[Flight]:
        """The flights as one batch of requests on the speculative engine, run to the end; then
        each flight's tokens, and its shadow decoded alone (or later: `late_shadows`)."""
        assert self._spec is not None
        rids = {f"specdash-{f.index}-{uuid.uuid4().hex[:8]}": f.index for f in flights}
        done = threading.Event()
        pump = threading.Thread(target=self._pump, args=(rids, step, done), daemon=True)
        pump.start()
        t0 = time.monotonic()
        try:
            texts = [f.text for f in flights]
            outs = generate(self._spec, texts, list(rids), self.settings.max_new_tokens)
        finally:
            done.set()
            pump.join()
        share = (time.monotonic() - t0) / len(flights)  # a batch's time split evenly
        for flight, out in zip(flights, outs, strict=True):
            self._record(flight, out, share)
            if self._shadow is not None:
                self._run_shadow(self._shadow, flight)
            else:
                flight.shadow_later = self.compare
            flight.done = True
            yield flight

    def _record(self, flight: Flight, out: _Output, seconds: float) -> None:
        """The speculative output into `flight`, its totals from SGLang's own counts (the
        telemetry's where SGLang has none), and its tokens as events."""
        request, k = self.requests[flight.index], self.settings.k
        steps, meta = request.accepted, out.meta
        flight.ids, flight.logprobs, request.texts = out.ids, out.logprobs, self._texts(out)
        request.cached = out.meta.get("cached_tokens")
        flight.decode_s = seconds
        flight.verify_steps = int(meta.get("spec_verify_ct", len(steps)) or 0)
        flight.accepted_drafts = int(meta.get("spec_num_correct_drafts", sum(steps)) or 0)
        flight.proposed_drafts = int(meta.get("spec_num_proposed_drafts", k * len(steps)) or 0)
        sources = token_sources(steps, len(out.ids))
        for pos, (source, tok) in enumerate(zip(sources, out.ids, strict=True)):
            lp = out.logprobs[pos]
            self._emit(
                Token(
                    prompt_index=flight.index,
                    position=pos,
                    token_id=tok,
                    logprob=lp if lp is not None else float("nan"),
                    text=request.texts[pos],
                    source=source,
                    step=request.step,
                )
            )

    def _pump(self, rids: dict[str, int], step: int, done: threading.Event) -> None:
        """Telemetry -> VerifyStep events of session step `step` while the batch decodes (each
        record to the prompt its request id names), then a final drain."""
        assert self._receiver is not None
        while True:
            finished = done.is_set()
            for record in self._receiver.drain(timeout_ms=20):
                index = rids.get(record.get("rid", ""))
                if index is None:
                    continue
                self.requests[index].accepted.append(record["accepted"])
                mode, gemm = self.settings.verify_mode, self.gemm_backend
                self._emit(verify_step_event(record, index, step, mode, gemm))
            if finished:
                return

    def _run_shadow(self, engine: SGLangEngine, flight: Flight) -> None:
        rid = f"specdash-shadow-{flight.index}"
        t0 = time.monotonic()
        (out,) = generate(
            engine, [flight.text], [rid], self.settings.max_new_tokens, SHADOW_TOP_LOGPROBS
        )
        flight.shadow_s = time.monotonic() - t0  # a whole request, as the speculative side's
        flight.shadow_ids, flight.shadow_logprobs = out.ids, out.logprobs
        request = self.requests[flight.index]
        request.shadow_texts, request.shadow_top = self._texts(out), out.top
        request.shadow_cached = out.meta.get("cached_tokens")

    def late_shadows(self, flights: list[Flight]) -> Iterator[Flight]:
        """Sequential shadow: once the speculative engine has shut down (its GPU memory free),
        the shadow engine starts and decodes each prompt."""
        if not flights:
            return
        self._engines.close()
        self._spec = None
        shadow = self._stack.enter_context(self._engine(self.shadow_kwargs, "shadow"))
        if self.gemm_backend != "auto":
            switch_gemm(shadow, self.gemm_backend)
        for flight in flights:
            self._run_shadow(shadow, flight)
            yield flight

    def evidence(self, flight: Flight, position: int, first: bool) -> Evidence:
        request = self.requests[flight.index]
        return Evidence(
            spec=(flight.ids[position], flight.logprobs[position]),
            shadow=(flight.shadow_ids[position], flight.shadow_logprobs[position]),
            texts=(request.texts[position], request.shadow_texts[position]),
            context=(
                self._tokenizer.decode(flight.context(position))
                if self._tokenizer is not None
                else ""
            ),
            step=request.step,
            k=self.settings.k,
            verify_mode=self.settings.verify_mode,
            gemm_backend=self.gemm_backend,
            margin=self._shadow_margin(request, position),
            prefix_cached=(
                (request.cached, request.shadow_cached)
                if request.cached is not None and request.shadow_cached is not None
                else None
            ),
        )

    def _shadow_margin(self, request: _Request, position: int) -> Margin | None:
        """The shadow's top-1 / top-2 at `position`, from the top logprobs SGLang returned for
        it. A difference of two log-softmax values of one row is the difference of their
        logits (the row's log-sum-exp cancels) up to the fp32 rounding of each logprob, so the
        gap reads as the logit gap, as the native engine's does. None where SGLang gave fewer
        than two."""
        top = request.shadow_top[position]
        if len(top) < 2:
            return None
        return Margin.between(top[0], top[1], self.dtype)

    def apply(self, name: str, value: object) -> bool:
        """The GEMM backend switches live on every scheduler rank of both engines; the other
        controls are fixed when the engines start."""
        if name == "gemm_backend":
            self._switch_gemm(str(value))
            return True
        message = f"the SGLang engine cannot change {name} live; restart the session"
        self._emit(EngineError(message=message, fatal=False))
        return False

    def _switch_gemm(self, name: str) -> None:
        if name == self.gemm_backend:
            return
        for engine in (self._spec, self._shadow):
            if engine is not None:
                switch_gemm(engine, name)
        self.gemm_backend = name

    def release(self, flight: Flight) -> None:
        del self.requests[flight.index]


def backend(settings: SessionSettings, options: SGLangOptions | None) -> SGLangBackend:
    """SGLang's entry in `specdash.registry.engines`."""
    return SGLangBackend(settings, options or SGLangOptions())


def switch_gemm(engine: SGLangEngine, name: str) -> None:
    """Every scheduler rank of `engine` to GEMM backend `name` (the patch's RPC); SGLang's
    refusal, e.g. DeepGEMM where it does not load, as one EnvironmentProblem line."""
    try:
        engine.collective_rpc("specdash_set_gemm_backend", name=name)
    except AssertionError as e:  # collective_rpc asserts the RPC's success
        raise EnvironmentProblem(f"GEMM backend {name!r} refused by SGLang: {e}") from None
