"""SGLang backend: a patched `sglang.Engine` in-process, speaking specdash's event stream.

Why a subclass: SGLang spawns its scheduler with `mp.set_start_method("spawn")`, so patches
made in this process are not inherited. `PatchedEngine.run_scheduler_process_func` is the
module-level `scheduler_entry`, which applies `specdash.engine_patches` in the scheduler
process before the Scheduler (and its CUDA graphs) exist, then runs SGLang's own entry.

Defaults make greedy speculative output comparable bit for bit with plain decoding:
deterministic inference, Triton attention and Triton GDN kernels, fp32 SSM state, chain
drafts (topk=1). Every `sglang.Engine` argument can still be overridden (`--sglang-arg
key=value`). The shadow run (no speculation) is a second engine on the same weights with
the GPU memory split between the two, or, when memory is short, runs after the speculative
engine has shut down (`sequential`).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, TextIO

from specdash.controls import Controls
from specdash.engine_patches import memory_pools_in_turn, telemetry
from specdash.engine_patches.registry import patch_row, sglang_version
from specdash.errors import EnvironmentProblem, UsageError
from specdash.events import (
    ControlChange,
    EngineError,
    PromptStart,
    Sink,
    Summary,
    Token,
    VerifyStep,
)
from specdash.runs.session_events import (
    SessionEvents,
    divergences_to_report,
    first_divergences,
)
from specdash.runs.sglang_host import EngineHost
from specdash.runs.sglang_preflight import check_can_start, explain_failure, last_line
from specdash.runs.sglang_start import StartWatch
from specdash.settings import SessionSettings

ALGORITHMS = ("NEXTN", "EAGLE3", "DFLASH", "STANDALONE", "NGRAM")
PATCHES_ENV = "SPECDASH_SGLANG_PATCHES"
"""Comma-separated patch names the scheduler entry applies; unset: all of them."""
ERROR_FILE_ENV = "SPECDASH_SGLANG_ERROR_FILE"
LOG_FILE_ENV = "SPECDASH_SGLANG_LOG"
"""Where a scheduler process writes the one-line reason it failed."""

EXACT_DEFAULTS: dict[str, Any] = {
    "enable_deterministic_inference": True,
    "attention_backend": "triton",
    "linear_attn_backend": "triton",
    "mamba_ssm_dtype": "float32",
}
CHAIN_ALGORITHMS = ("NEXTN", "EAGLE3", "STANDALONE")
"""Algorithms whose draft length specdash sets from -k (steps=k, topk=1, k+1 verify tokens);
DFLASH takes its block size from the draft model, NGRAM its own defaults."""
SPLIT_MEM_FRACTION = 0.4
"""mem_fraction_static of each engine when spec and shadow engines share the GPU."""
START_DEFAULTS: dict[str, Any] = {
    "log_level": "info",
    "cuda_graph_bs_decode": [1],
    "disable_prefill_cuda_graph": True,
}
"""What makes a session start sooner. `log_level=info`: SGLang's start lines, which
`sglang_start.StartWatch` turns into phases, go to the session's log file. A session sends one
request at a time, so only batch size 1 is captured (SGLang's default list is 23 to 36 sizes
per graph set), and no prefill graphs (58 token counts: 46 s cold, 5 s warm on the H200). The
graph settings apply only where no `--sglang-arg` names a CUDA-graph setting."""


@dataclass(frozen=True)
class SGLangOptions:
    """What `--engine sglang` needs beyond SessionSettings."""

    speculative_algorithm: str = "NEXTN"
    engine_args: dict[str, Any] = field(default_factory=dict)
    shadow_mode: Literal["split", "sequential"] = "split"
    force_patches: bool = False
    unpatch: tuple[str, ...] = ()
    """Patch flags (`gdn`, `attention`, `gemm`, `telemetry`) left off in both engines, to see
    which fix matters on a model: the divergences come back."""
    log_file: Path | None = None
    """Where SGLang's processes write their output; None: `log_file_beside` the trace. Never
    the terminal: a TUI owns it, headless prints one line per error, and the start phases are
    read from the file."""


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, value); the value as a Python literal when it is one, else str."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key.isidentifier():
        raise UsageError(f"--sglang-arg {text!r}: expected KEY=VALUE, e.g. mem_fraction_static=0.4")
    lowered = {"true": True, "false": False}  # `none` stays a string: grammar_backend=none
    if raw.strip().lower() in lowered:
        return key, lowered[raw.strip().lower()]
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def log_file_beside(settings: SessionSettings) -> Path:
    """Where a session's SGLang output goes: beside the trace, else in the temp dir."""
    if settings.trace is not None:
        return settings.trace.with_name(settings.trace.name + ".sglang.log")
    return Path(tempfile.gettempdir()) / f"specdash-sglang-{os.getpid()}.log"


def shadow_log(log: Path) -> Path:
    """The shadow engine's log beside the session's: its start runs at the same time."""
    return log.with_name(log.name.removesuffix(".log") + "-shadow.log")


def engine_kwargs(
    settings: SessionSettings, options: SGLangOptions, *, speculative: bool, split: bool
) -> dict[str, Any]:
    """sglang.Engine keyword arguments: exactness and start defaults < session settings <
    --sglang-arg."""
    if settings.model is None:
        raise UsageError("--engine sglang needs --model DIR (an HF checkpoint SGLang can load)")
    kw: dict[str, Any] = {
        **EXACT_DEFAULTS,
        "model_path": str(settings.model),
        "random_seed": settings.seed,
        "skip_tokenizer_init": False,
        "custom_sigquit_handler": scheduler_failed,
    }
    if settings.dtype is not None:
        kw["dtype"] = settings.dtype
    if split:
        kw["mem_fraction_static"] = SPLIT_MEM_FRACTION
    if speculative:
        kw["speculative_algorithm"] = options.speculative_algorithm
        if options.speculative_algorithm in CHAIN_ALGORITHMS:
            kw["speculative_num_steps"] = settings.k
            kw["speculative_eagle_topk"] = 1
            kw["speculative_num_draft_tokens"] = settings.k + 1
        elif options.speculative_algorithm == "NGRAM":
            # k + 1 verify tokens. The breadth stays SGLang's (10): NGRAM drafts are trees even
            # at breadth 1 (several trie anchors), and SGLang gives GDN verify the parent of
            # each row only when breadth (its eagle topk) > 1. At breadth 1 the GDN state ran
            # down the packed rows as if they were a chain: on the H200, k=5, 2/24 prompts
            # differed. The attention rows read each row's ancestors from the tree mask.
            kw["speculative_num_draft_tokens"] = settings.k + 1
        if options.speculative_algorithm == "NEXTN":
            kw["speculative_draft_model_path"] = str(settings.draft or settings.model)
        elif settings.draft is not None:
            kw["speculative_draft_model_path"] = str(settings.draft)
    user = dict(options.engine_args)
    if not speculative:
        user = {k: v for k, v in user.items() if not k.startswith("speculative_")}
    graph_choice = any("cuda_graph" in key for key in user)
    start = {k: v for k, v in START_DEFAULTS.items() if "cuda_graph" not in k or not graph_choice}
    merged = {**start, **kw, **user}
    eager_rows = _patch_row() == "0.5.23" and "attention" not in options.unpatch
    if speculative and merged["attention_backend"] == "triton" and eager_rows and not graph_choice:
        # 0.5.23's Triton decode-row verify sizes its row index table from the batch (a host
        # sync), so it cannot be captured: decode/verify graphs off unless asked for.
        merged["disable_decode_cuda_graph"] = True
    return merged


def _patch_row() -> str | None:
    """The release row the scheduler applies (the installed one, or the one --force-patches
    chose); None where none applies: the engine is refused before it starts."""
    try:
        return patch_row()
    except RuntimeError:
        return None


def applied_patches(options: SGLangOptions) -> list[str]:
    """Names of the patches the scheduler processes apply: all but `--sglang-unpatch`."""
    from specdash.engine_patches import patch_set

    try:
        off = {patch_set.by_flag(flag).name for flag in options.unpatch}
    except KeyError as e:
        raise UsageError(f"--sglang-unpatch: {e.args[0]}") from None
    return [p.name for p in patch_set.all_patches() if p.name not in off]


class SchedulerFailed(EnvironmentProblem):
    """A scheduler process died; the message is its own last line (e.g. SGLang's ValueError).
    An EnvironmentProblem, so headless prints that line and exits 4, not a traceback."""


class _ReasonToFile(logging.Handler):
    """In the scheduler (and detokenizer): SGLang logs "Scheduler hit an exception: <traceback>"
    before it sends SIGQUIT to the parent; keep the traceback's last line for the parent."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.ERROR)
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "hit an exception" in message:
            write_reason(self.path, explain_failure(message))


def write_reason(path: str, reason: str) -> None:
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as f:
        f.write(reason)


def read_reason(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def new_shared_file(kind: str = "error") -> str:
    """An empty temp file for SGLang's processes to share (a failure reason, a lock)."""
    fd, path = tempfile.mkstemp(prefix=f"specdash-sglang-{kind}-")
    os.close(fd)
    return path


def _child_process(logger: str) -> str | None:
    """In an SGLang child process: fds 1 and 2 to `LOG_FILE_ENV`'s file when set, and the
    reason it dies with (`logger`'s "hit an exception") to the error file the parent reads."""
    path = os.environ.get(LOG_FILE_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file:
        logging.getLogger(logger).addHandler(_ReasonToFile(error_file))
    return error_file


def detokenizer_entry(*args: Any, **kwargs: Any) -> Any:
    """SGLang's detokenizer process entry; its output and its death reported as the
    scheduler's are."""
    _child_process("sglang.srt.managers.detokenizer_manager")
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process

    return run_detokenizer_process(*args, **kwargs)


def scheduler_entry(*args: Any, **kwargs: Any) -> Any:
    """SGLang's scheduler process entry with the specdash patches applied first."""
    error_file = _child_process("sglang.srt.managers.scheduler")
    try:
        from specdash.engine_patches import patch_set

        names = os.environ.get(PATCHES_ENV)
        patch_set.apply_all(None if names is None else [n for n in names.split(",") if n])
    except Exception as e:
        if error_file:
            write_reason(error_file, f"specdash patches failed: {type(e).__name__}: {e}")
        raise
    from sglang.srt.managers.scheduler import run_scheduler_process

    if not first_rank(run_scheduler_process, args, kwargs):  # see memory_pools_in_turn
        os.environ.pop(memory_pools_in_turn.TURN_ENV, None)
    return run_scheduler_process(*args, **kwargs)


def first_rank(entry: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether a scheduler process (`entry(*args, **kwargs)`) is its engine's first: tensor,
    pipeline and data parallel rank 0 (the releases' entries take different arguments). A call
    that does not bind says no: without the turn an engine starts as SGLang's own would."""
    try:
        bound = inspect.signature(entry).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return False
    return not any(bound.get(rank) for rank in ("tp_rank", "pp_rank", "dp_rank"))


def scheduler_failed(signum: int, frame: Any) -> None:
    """`custom_sigquit_handler`: SGLang's default kills this whole process tree when a
    scheduler dies; raise its reason in the main thread instead."""
    from sglang.srt.utils.common import kill_process_tree

    reason = read_reason(os.environ.get(ERROR_FILE_ENV))
    kill_process_tree(os.getpid(), include_parent=False)
    log = os.environ.get(LOG_FILE_ENV)
    where = f"SGLang's log: {log}" if log else "see its log above"
    raise SchedulerFailed(reason or f"an SGLang scheduler process died ({where})")


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def patched_engine_class() -> type:
    """`sglang.Engine` with the patching scheduler entry. The class comes from its module:
    `sglang.Engine` is a `sglang.utils.LazyImport` instance, which cannot be subclassed."""
    from sglang.srt.entrypoints.engine import Engine

    class PatchedEngine(Engine):
        run_scheduler_process_func = staticmethod(scheduler_entry)
        run_detokenizer_process_func = staticmethod(detokenizer_entry)

    return PatchedEngine


def check_environment(options: SGLangOptions, engines: list[dict[str, Any]]) -> None:
    """Install hint, CUDA, patch targets, the algorithm name and whether each engine's
    arguments (`engines`) can start on this machine, before anything is started."""
    from specdash.engine_patches.check import ensure_patchable, require_sglang

    require_sglang()
    import torch

    if not torch.cuda.is_available():
        raise EnvironmentProblem("--engine sglang needs a CUDA GPU; none is visible to torch")
    if options.speculative_algorithm not in ALGORITHMS:
        raise UsageError(
            f"--speculative-algorithm {options.speculative_algorithm!r}: "
            f"one of {', '.join(ALGORITHMS)}"
        )
    ensure_patchable(options.force_patches)
    os.environ[PATCHES_ENV] = ",".join(applied_patches(options))
    for kwargs in engines:
        check_can_start(kwargs, torch.cuda.device_count())


def start_engine(kwargs: dict[str, Any], engine_class: Callable[[], type] | None = None) -> Any:
    """A PatchedEngine (`engine_class()`, default `patched_engine_class()`), with SGLang's own
    refusal (unknown argument, a speculative algorithm the model does not support, ...) as a
    one-line error."""
    if ERROR_FILE_ENV not in os.environ:  # a session sets (and removes) it; setdefault's
        os.environ[ERROR_FILE_ENV] = new_shared_file()  # eager default leaked a file per start
    error_file = os.environ[ERROR_FILE_ENV]
    _start_resource_tracker()
    try:
        return (engine_class or patched_engine_class)()(**kwargs)
    except TypeError as e:
        raise UsageError(f"sglang.Engine rejected an argument: {e}") from None
    except (ValueError, NotImplementedError, AssertionError, RuntimeError) as e:
        reason = read_reason(error_file) or last_line(str(e)) or type(e).__name__
        algo = kwargs.get("speculative_algorithm")
        what = f"with --speculative-algorithm {algo}" if algo else "(shadow, no speculation)"
        raise UsageError(f"sglang could not start {what}: {reason}") from None


def _start_resource_tracker() -> None:
    """multiprocessing's resource tracker, started with the real stderr before SGLang spawns
    its processes. It passes `sys.stderr.fileno()` to its child, and under Textual sys.stderr
    is a print capture whose fileno() is -1: every dashboard start of SGLang failed with
    'bad value(s) in fds_to_keep'."""
    from multiprocessing import resource_tracker

    with contextlib.redirect_stderr(sys.__stderr__):
        resource_tracker.ensure_running()


class TelemetryReceiver:
    """PULL end of the scheduler's telemetry; binds before the engine starts (env var)."""

    def __init__(self) -> None:
        import zmq

        self._zmq = zmq
        path = os.path.join(tempfile.gettempdir(), f"specdash-telemetry-{uuid.uuid4().hex}")
        self.address = f"ipc://{path}"
        self._sock = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.address)
        self._path = path

    def drain(self, timeout_ms: int = 0) -> list[dict[str, Any]]:
        """Every record waiting now (waiting up to timeout_ms for the first)."""
        out = []
        if timeout_ms and not self._sock.poll(timeout_ms):
            return out
        while True:
            try:
                out.append(self._sock.recv_json(flags=self._zmq.NOBLOCK))
            except self._zmq.Again:
                return out

    def close(self) -> None:
        self._sock.close()
        _remove(self._path)


def verify_step_event(
    record: dict[str, Any], prompt_index: int, step: int, verify_mode: str, gemm_backend: str
) -> VerifyStep:
    """A telemetry record as the VerifyStep the native engine emits.

    SGLang's draft proposals arrive only when their async copy finished before the step was
    resolved; otherwise the rejected drafts are unknown and reported as -1 (the accepted ones
    are the emitted tokens), so `len(draft_tokens)` is still k.
    """
    k, accepted, emitted = record["k"], record["accepted"], record["emitted"]
    drafts = record.get("drafts")
    if drafts is None or len(drafts) != k:
        drafts = emitted[:accepted] + [-1] * (k - accepted)
    return VerifyStep(
        prompt_index=prompt_index,
        step=step,
        k=k,
        accepted=accepted,
        draft_tokens=drafts,
        emitted_tokens=emitted,
        verify_mode=verify_mode,
        gemm_backend=gemm_backend,
        draft_s=(record.get("draft_s") or 0.0) + (record.get("draft_extend_s") or 0.0),
        verify_s=record.get("verify_s") or 0.0,
        shadow_s=0.0,
        rollback_s=0.0,
    )


def token_sources(accepted_per_step: list[int], n_tokens: int) -> Iterator[tuple[str, int]]:
    """(source, step) per output token: the prefill's token, then each verify step's accepted
    drafts and its bonus token."""
    if n_tokens == 0:
        return
    yield "decode", -1
    produced = 1
    for step, accepted in enumerate(accepted_per_step):
        for i in range(accepted + 1):
            if produced == n_tokens:
                return
            yield ("bonus" if i == accepted else "draft"), step
            produced += 1
    while produced < n_tokens:  # steps whose telemetry was dropped
        yield "decode", -1
        produced += 1


@dataclass
class _Output:
    ids: list[int]
    logprobs: list[float | None]
    texts: list[str]
    seconds: float
    meta: dict[str, Any]

    def logprob(self, pos: int) -> float | None:
        """The logprob of output token `pos`; None where SGLang returned none."""
        return self.logprobs[pos] if pos < len(self.logprobs) else None

    def text(self, pos: int) -> str:
        """The text of output token `pos`; empty where SGLang returned none."""
        return self.texts[pos] if pos < len(self.texts) else ""


def _count_tokens(engine: Any, text: str) -> int:
    tokenizer = getattr(engine.tokenizer_manager, "tokenizer", None)
    return len(tokenizer.encode(text)) if tokenizer is not None else 0


def _generate(engine: Any, text: str, rid: str, max_new_tokens: int) -> _Output:
    t0 = time.monotonic()
    out = engine.generate(
        prompt=text,
        sampling_params={"temperature": 0.0, "max_new_tokens": max_new_tokens},
        return_logprob=True,
        rid=rid,
    )
    meta = out["meta_info"]
    triples = meta.get("output_token_logprobs") or []
    return _Output(
        ids=[int(t) for t in out["output_ids"]],
        logprobs=[lp for lp, _, _ in triples],
        texts=[tx or "" for _, _, tx in triples],
        seconds=time.monotonic() - t0,
        meta=meta,
    )


class SGLangSession:
    """One session on SGLang engines; `run()` returns the Summary it emitted last."""

    def __init__(
        self,
        settings: SessionSettings,
        sink: Sink,
        controls: Controls | None,
        stop: threading.Event | None,
        options: SGLangOptions,
    ) -> None:
        self.settings, self.options = settings, options
        self.controls, self.stop = controls, stop or threading.Event()
        self.gemm_backend = "auto"
        self.steps: dict[int, list[int]] = {}
        self.receiver: TelemetryReceiver | None = None
        self.log_file = options.log_file or log_file_beside(settings)
        self._parent_log: TextIO | None = None
        self.events = SessionEvents(settings, sink)
        self.stats = self.events.stats
        self.emit = self.events.emit

    def run(self) -> Summary:
        from specdash.prompts import load_prompts

        spec_on = self.settings.speculation
        compare = self.settings.shadow and spec_on
        split = compare and self.options.shadow_mode == "split"
        spec_kw = engine_kwargs(self.settings, self.options, speculative=spec_on, split=split)
        shadow_kw = engine_kwargs(self.settings, self.options, speculative=False, split=split)
        check_environment(self.options, [spec_kw, shadow_kw] if compare else [spec_kw])
        prompts = load_prompts(self.settings.prompts)
        with contextlib.ExitStack() as session:
            self.receiver = TelemetryReceiver()
            session.callback(self.receiver.close)
            os.environ[telemetry.ADDRESS_ENV] = self.receiver.address
            os.environ[ERROR_FILE_ENV] = new_shared_file()
            session.callback(_remove, os.environ[ERROR_FILE_ENV])
            os.environ[LOG_FILE_ENV] = str(self.log_file)
            session.callback(os.environ.pop, LOG_FILE_ENV, None)
            if split:  # both engines start now: their memory pools are sized in turn
                os.environ[memory_pools_in_turn.TURN_ENV] = new_shared_file("pool-turn")
                session.callback(_remove, os.environ[memory_pools_in_turn.TURN_ENV])
                session.callback(os.environ.pop, memory_pools_in_turn.TURN_ENV, None)
            with contextlib.ExitStack() as engines:
                # split: the shadow starts in its host process while the spec engine starts here
                shadow_ready = engines.enter_context(self._hosted(shadow_kw)) if split else None
                spec = engines.enter_context(self._engine(spec_kw, "spec" if spec_on else "plain"))
                shadow = shadow_ready() if shadow_ready is not None else None
                spec_outputs = self._run_prompts(prompts, spec, shadow, compare)
            if compare and not split:  # sequential: the spec engine has released the GPU
                with self._engine(shadow_kw, "shadow") as shadow:
                    if self.gemm_backend != "auto":
                        switch_gemm(shadow, self.gemm_backend)
                    for index, (prompt, out) in enumerate(zip(prompts, spec_outputs, strict=False)):
                        self._compare(index, out, self._run_shadow(shadow, index, prompt.text))
        return self.events.finish()

    def _run_prompts(
        self, prompts: list[Any], spec: Any, shadow: Any, compare: bool
    ) -> list[_Output]:
        self._set_gemm_backend(spec, shadow, self.settings.gemm_backend, step=0, announce=False)
        self._session_start()
        spec_outputs = []
        for index, prompt in enumerate(prompts):
            if self.stop.is_set():
                break
            self._apply_controls(spec, shadow, index)
            self.emit(
                PromptStart(
                    prompt_index=index,
                    prompt_tokens=_count_tokens(spec, prompt.text),
                    text=prompt.text,
                )
            )
            out = self._run_spec(spec, index, prompt.text)
            spec_outputs.append(out)
            if shadow is not None:
                self._compare(index, out, self._run_shadow(shadow, index, prompt.text))
            elif not compare:
                self._done(index, out, checked=False)
        return spec_outputs

    @contextlib.contextmanager
    def _engine(self, kwargs: dict[str, Any], name: str) -> Iterator[Any]:
        """An engine of this process, its start phases read from the session's log. SGLang's
        logging in this process goes to that log too: its `basicConfig` handler binds the
        `sys.stderr` of the moment, here the log file, which stays open for the process's
        life (the handler writes to it after the engine has shut down)."""
        if self._parent_log is None:
            self._parent_log = self.log_file.open("a", encoding="utf-8", buffering=1)
        with (
            StartWatch(self.log_file, name, self.emit),
            contextlib.redirect_stderr(self._parent_log),
        ):
            engine = start_engine(kwargs)
        try:
            yield engine
        finally:
            engine.shutdown()

    @contextlib.contextmanager
    def _hosted(self, kwargs: dict[str, Any]) -> Iterator[Callable[[], EngineHost]]:
        """The shadow engine starting in its host process; the callable waits until it has
        started and returns it."""
        log = shadow_log(self.log_file)
        watch = StartWatch(log, "shadow", self.emit)
        watch.start()
        error_file = new_shared_file()
        env = {LOG_FILE_ENV: str(log), ERROR_FILE_ENV: error_file}
        _start_resource_tracker()  # spawning the host needs it, as spawning SGLang's processes
        host = EngineHost(
            kwargs, env, log, partial(start_engine, engine_class=patched_engine_class)
        )

        def ready() -> EngineHost:
            try:
                host.wait_ready()
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
            _remove(error_file)

    def _session_start(self) -> None:
        import torch

        self.events.session_start(
            {
                "speculative_algorithm": self.options.speculative_algorithm,
                "sglang_args": {k: repr(v) for k, v in self.options.engine_args.items()},
                "shadow_mode": self.options.shadow_mode,
                "sglang_patches": applied_patches(self.options),
            },
            {"sglang": sglang_version() or "?", "torch": torch.__version__},
            f"cuda {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no CUDA",
            self.gemm_backend,
        )

    def _run_spec(self, engine: Any, index: int, text: str) -> _Output:
        rid = f"specdash-{index}-{uuid.uuid4().hex[:8]}"
        self.steps[index] = []
        done = threading.Event()
        pump = threading.Thread(target=self._pump, args=(rid, index, done), daemon=True)
        pump.start()
        try:
            out = _generate(engine, text, rid, self.settings.max_new_tokens)
        finally:
            done.set()
            pump.join()
        sources = token_sources(self.steps[index], len(out.ids))
        for pos, ((source, step), tok) in enumerate(zip(sources, out.ids, strict=True)):
            lp = out.logprob(pos)
            self.emit(
                Token(
                    prompt_index=index,
                    position=pos,
                    token_id=tok,
                    logprob=lp if lp is not None else float("nan"),
                    text=out.text(pos),
                    source=source,
                    step=step,
                )
            )
        return out

    def _pump(self, rid: str, index: int, done: threading.Event) -> None:
        """Telemetry -> VerifyStep events while the prompt decodes, then a final drain."""
        assert self.receiver is not None
        while True:
            finished = done.is_set()
            for record in self.receiver.drain(timeout_ms=20):
                if record.get("rid") != rid:
                    continue
                step = len(self.steps[index])
                self.steps[index].append(record["accepted"])
                self.emit(
                    verify_step_event(record, index, step, self.settings.verify, self.gemm_backend)
                )
            if finished:
                return

    def _run_shadow(self, engine: Any, index: int, text: str) -> _Output:
        return _generate(engine, text, f"specdash-shadow-{index}", self.settings.max_new_tokens)

    def _compare(self, index: int, spec: _Output, shadow: _Output) -> None:
        """The first position where ids or fp32 logprob bits differ, and the first where the ids
        do when that is later (the text changed too) -> a Divergence each; then PromptDone."""
        bits_at, text_at = first_divergences(spec.ids, spec.logprobs, shadow.ids, shadow.logprobs)
        for pos in divergences_to_report(bits_at, text_at):
            self._emit_divergence(index, spec, shadow, pos)
        same_length = len(spec.ids) == len(shadow.ids)
        self._done(index, spec, True, bits_at, text_at, same_length)

    def _emit_divergence(self, index: int, spec: _Output, shadow: _Output, pos: int) -> None:
        sources = list(token_sources(self.steps.get(index, []), len(spec.ids)))
        self.events.divergence(
            index,
            pos,
            step=sources[pos][1],
            k=self.settings.k,
            verify_mode=self.settings.verify,
            gemm_backend=self.gemm_backend,
            spec=(spec.ids[pos], spec.logprob(pos), spec.text(pos)),
            shadow=(shadow.ids[pos], shadow.logprob(pos), shadow.text(pos)),
        )

    def _done(
        self,
        index: int,
        out: _Output,
        checked: bool,
        bits_at: int | None = None,
        text_at: int | None = None,
        same_length: bool = True,
    ) -> None:
        steps = self.steps.get(index, [])
        k, meta = self.settings.k, out.meta
        self.events.prompt_done(
            index,
            new_tokens=len(out.ids),
            seconds=out.seconds,
            verify_steps=int(meta.get("spec_verify_ct", len(steps)) or 0),
            accepted_drafts=int(meta.get("spec_num_correct_drafts", sum(steps)) or 0),
            proposed_drafts=int(meta.get("spec_num_proposed_drafts", k * len(steps)) or 0),
            checked=checked,
            bits_at=bits_at,
            text_at=text_at,
            compared_all=same_length,
        )

    def _apply_controls(self, spec: Any, shadow: Any, index: int) -> None:
        """Between prompts: pause, and the live GEMM switch on every scheduler rank."""
        if self.controls is None:
            return
        self.controls.wait_while_paused(self.stop)
        state = self.controls.snapshot()
        if state.gemm_backend != self.gemm_backend:
            self._set_gemm_backend(spec, shadow, state.gemm_backend, step=index)
        unsupported = {
            "k": state.k != self.settings.k,
            "speculation": state.speculation != self.settings.speculation,
            "verify_mode": state.verify_mode != self.settings.verify,
        }
        for name, changed in unsupported.items():
            if changed:
                self.emit(
                    EngineError(
                        message=f"--engine sglang cannot change {name} live; restart the session",
                        fatal=False,
                    )
                )
                self.controls.update(
                    **{name: getattr(self.settings, "verify" if name == "verify_mode" else name)}
                )

    def _set_gemm_backend(
        self, spec: Any, shadow: Any, name: str, step: int, announce: bool = True
    ) -> None:
        """Switch every scheduler rank of both engines; a ControlChange unless at session start."""
        if name == self.gemm_backend:
            return
        for engine in (spec, shadow):
            if engine is not None:
                switch_gemm(engine, name)
        if announce:
            self.emit(
                ControlChange(
                    name="gemm_backend", old=self.gemm_backend, new=name, applied_step=step
                )
            )
        self.gemm_backend = name


def switch_gemm(engine: Any, name: str) -> None:
    """Every scheduler rank of `engine` to GEMM backend `name` (the patch's RPC); SGLang's
    refusal, e.g. DeepGEMM where it does not load, as one EnvironmentProblem line."""
    try:
        engine.collective_rpc("specdash_set_gemm_backend", name=name)
    except AssertionError as e:  # collective_rpc asserts the RPC's success
        raise EnvironmentProblem(f"GEMM backend {name!r} refused by SGLang: {e}") from None


class SGLangRunner:
    """A patched `sglang.Engine` as a `specdash.runs.runner.Runner` (the same events and
    Summary as the native runner), with the SGLang options beyond `SessionSettings`."""

    def __init__(self, options: SGLangOptions) -> None:
        self.options = options

    def run(
        self,
        settings: SessionSettings,
        sink: Sink,
        controls: Controls | None = None,
        stop: threading.Event | None = None,
    ) -> Summary:
        return SGLangSession(settings, sink, controls, stop, self.options).run()
