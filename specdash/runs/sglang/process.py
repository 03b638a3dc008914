"""SGLang's processes: how an engine is started, what its child processes run first, where their
output goes, and how a child's death reaches this process. The one place where settings cross
into SGLang's processes as environment variables (`session_environment`, `host_environment`).

Why a subclass: SGLang spawns its scheduler with `mp.set_start_method("spawn")`, so patches
made in this process are not inherited. `PatchedEngine.run_scheduler_process_func` is the
module-level `scheduler_entry`, which applies `specdash.runs.sglang.patches` in the scheduler
process before the Scheduler (and its CUDA graphs) exist, then runs SGLang's own entry.
Spawned processes inherit the environment, so that is how the patch list and its release row,
the telemetry address, the log and error files, the memory-pool turn and the FP8 switches
`fp8_routing.PINNED_ENV` pins reach them; nothing else of specdash sets an environment variable.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from specdash.errors import EnvironmentProblem, UsageError
from specdash.runs.sglang.patches import fp8_routing, memory_pools_in_turn, registry, telemetry
from specdash.runs.sglang.preflight import explain_failure, last_line
from specdash.runs.spawn import redirect_output, start_resource_tracker
from specdash.settings import SessionSettings

PATCHES_ENV = "SPECDASH_SGLANG_PATCHES"
"""Comma-separated patch names the scheduler entry applies; unset: all of them."""
ERROR_FILE_ENV = "SPECDASH_SGLANG_ERROR_FILE"
"""Where a scheduler process writes the one-line reason it failed."""
LOG_FILE_ENV = "SPECDASH_SGLANG_LOG"
"""Where SGLang's child processes write their output (fds 1 and 2)."""


class SGLangEngine(Protocol):
    """What specdash calls on an `sglang.Engine` (and on `host.EngineHost`, which forwards to
    one in its own process)."""

    def generate(
        self,
        *,
        prompt: list[str],
        sampling_params: dict[str, Any],
        return_logprob: bool,
        rid: list[str],
        top_logprobs_num: int | None,
    ) -> list[dict[str, Any]]: ...

    def collective_rpc(self, method: str, **kwargs: Any) -> Any: ...

    def flush_cache(self) -> Any: ...

    def shutdown(self) -> None: ...


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


def engine_tokenizer(engine: object) -> Tokenizer | None:
    """An in-process engine's tokenizer (None with `skip_tokenizer_init`, or a stand-in)."""
    return getattr(getattr(engine, "tokenizer_manager", None), "tokenizer", None)


def engine_dtype(engine: Any) -> str:
    """The dtype an in-process engine's model computes in ("bfloat16", ...), as SGLang resolved
    it from its `dtype` argument and the checkpoint ("auto": the checkpoint's own)."""
    return str(engine.tokenizer_manager.model_config.dtype).removeprefix("torch.")


def log_file_beside(settings: SessionSettings) -> Path:
    """Where a session's SGLang output goes: beside the trace, else in the temp dir."""
    if settings.trace is not None:
        return settings.trace.with_name(settings.trace.name + ".sglang.log")
    return Path(tempfile.gettempdir()) / f"specdash-sglang-{os.getpid()}.log"


def shadow_log(log: Path) -> Path:
    """The shadow engine's log beside the session's: its start runs at the same time."""
    return log.with_name(log.name.removesuffix(".log") + "-shadow.log")


def new_shared_file(kind: str = "error") -> str:
    """An empty temp file for SGLang's processes to share (a failure reason, a lock)."""
    fd, path = tempfile.mkstemp(prefix=f"specdash-sglang-{kind}-")
    os.close(fd)
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """`values` set in this process's environment (so in every process it spawns) for the
    block, the previous values back after it."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def session_environment(
    patches: list[str],
    telemetry_address: str | None,
    log: Path | None,
    pools_in_turn: bool,
    row: str | None = None,
) -> Iterator[None]:
    """What a session's SGLang processes read from the environment, for the session: the
    patches to apply and the release row of their variants (None: the installed release's),
    where telemetry goes and the log (None: neither is redirected), a fresh error file, when
    two engines start at once, the lock their memory pools are sized in turn with, and with the
    FP8 patch on, SGLang's M-dependent FP8 kernel switches off (they are read when SGLang's
    modules import, before any patch could see them)."""
    files = {ERROR_FILE_ENV: new_shared_file()}
    if pools_in_turn:
        files[memory_pools_in_turn.TURN_ENV] = new_shared_file("pool-turn")
    values = {PATCHES_ENV: ",".join(patches), **files}
    if row is not None:
        values[registry.ROW_ENV] = row
    if fp8_routing.PATCH.name in patches:
        values.update(fp8_routing.PINNED_ENV)
    if telemetry_address is not None:
        values[telemetry.ADDRESS_ENV] = telemetry_address
    if log is not None:
        values[LOG_FILE_ENV] = str(log)
    try:
        with _environment(values):
            yield
    finally:
        for path in files.values():
            _remove(path)


@contextlib.contextmanager
def host_environment(log: Path) -> Iterator[dict[str, str]]:
    """What a host process (`host.EngineHost`) sets in its own environment before it starts
    its engine: its own log and error file (removed after)."""
    error_file = new_shared_file()
    try:
        yield {LOG_FILE_ENV: str(log), ERROR_FILE_ENV: error_file}
    finally:
        _remove(error_file)


def enter_host(env: dict[str, str], log: str) -> None:
    """In a host process, first: `host_environment`'s values, and its output to `log`."""
    os.environ.update(env)
    redirect_output(log)


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


def _child_process(logger: str) -> str | None:
    """In an SGLang child process: its output to `LOG_FILE_ENV`'s file when set, and the
    reason it dies with (`logger`'s "hit an exception") to the error file the parent reads."""
    path = os.environ.get(LOG_FILE_ENV)
    if path:
        redirect_output(path)
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
        from specdash.runs.sglang.patches import patch_set

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


def scheduler_failed(signum: int, frame: FrameType | None) -> None:
    """`custom_sigquit_handler`: SGLang's default kills this whole process tree when a
    scheduler dies; raise its reason in the main thread instead."""
    from sglang.srt.utils.common import kill_process_tree

    reason = read_reason(os.environ.get(ERROR_FILE_ENV))
    kill_process_tree(os.getpid(), include_parent=False)
    log = os.environ.get(LOG_FILE_ENV)
    where = f"SGLang's log: {log}" if log else "see its log above"
    raise SchedulerFailed(reason or f"an SGLang scheduler process died ({where})")


def patched_engine_class() -> type:
    """`sglang.Engine` with the patching scheduler entry. The class comes from its module:
    `sglang.Engine` is a `sglang.utils.LazyImport` instance, which cannot be subclassed."""
    from sglang.srt.entrypoints.engine import Engine

    class PatchedEngine(Engine):
        run_scheduler_process_func = staticmethod(scheduler_entry)
        run_detokenizer_process_func = staticmethod(detokenizer_entry)

    return PatchedEngine


def start_engine(
    kwargs: dict[str, Any], engine_class: Callable[[], type] | None = None
) -> SGLangEngine:
    """A PatchedEngine (`engine_class()`, default `patched_engine_class()`) with SGLang's
    scheduler failures raised as `SchedulerFailed`, and SGLang's own refusal (unknown argument,
    a speculative algorithm the model does not support, ...) as a one-line error."""
    start_resource_tracker()
    try:
        return (engine_class or patched_engine_class)()(
            **kwargs, custom_sigquit_handler=scheduler_failed
        )
    except TypeError as e:
        raise UsageError(f"sglang.Engine rejected an argument: {e}") from None
    except (ValueError, NotImplementedError, AssertionError, RuntimeError) as e:
        reason = read_reason(os.environ.get(ERROR_FILE_ENV)) or last_line(str(e))
        algo = kwargs.get("speculative_algorithm")
        what = f"with speculative algorithm {algo}" if algo else "(shadow, no speculation)"
        raise UsageError(f"sglang could not start {what}: {reason or type(e).__name__}") from None
