"""An SGLang engine in a process of its own, so the shadow engine starts while the speculative
one does.

Why a process: `sglang.Engine()` blocks for its whole start (its scheduler's imports, weights,
CUDA graph captures: half a minute or more) and installs a signal handler, which only the main
thread of a process may do, so two engines of one process start one after the other. The
shadow engine is built in a spawned host process instead, whose main thread serves
`generate` and `collective_rpc` over a pipe; the session talks to it as to an engine. The host
writes its own and its SGLang processes' output to `log`, and dies with its parent: a closed
pipe shuts the engine down.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from specdash.errors import EnvironmentProblem
from specdash.runs.sglang.process import enter_host
from specdash.runs.spawn import start_resource_tracker

SHUTDOWN_WAIT_S = 60.0


class EngineHost:
    """The engine `start(kwargs)` builds, built in a spawned process with `env` set there first
    (`process.host_environment`; `start` pickles by name: a module-level function, or a partial
    of one). `wait_ready` blocks until it has started, or raises why not. An
    `process.SGLangEngine` for the session."""

    def __init__(
        self,
        kwargs: dict[str, Any],
        env: dict[str, str],
        log: Path,
        start: Callable[[dict[str, Any]], Any],
    ) -> None:
        start_resource_tracker()
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=serve,
            args=(child, start, kwargs, env, str(log)),
            name="specdash-sglang-shadow",
        )
        self._proc.start()  # not a daemon: a daemon process may not start SGLang's processes
        child.close()

    def _call(self, *request: Any) -> Any:
        try:
            self._conn.send(request)
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            raise EnvironmentProblem(
                f"the shadow engine's host process ended (exit code {self._proc.exitcode})"
            ) from None
        if kind == "error":
            raise value
        return value

    def wait_ready(self) -> None:
        self._call("ready")

    def generate(self, **kwargs: Any) -> list[dict[str, Any]]:
        return self._call("generate", kwargs)

    def collective_rpc(self, method: str, **kwargs: Any) -> Any:
        return self._call("collective_rpc", method, kwargs)

    def flush_cache(self) -> Any:
        return self._call("flush_cache")

    def shutdown(self) -> None:
        with contextlib.suppress(EOFError, OSError):
            self._conn.send(("shutdown",))
            self._conn.recv()
        self._conn.close()
        self._proc.join(SHUTDOWN_WAIT_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


def _picklable(e: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def serve(
    conn: Connection,
    start: Callable[[dict[str, Any]], Any],
    kwargs: dict[str, Any],
    env: dict[str, str],
    log: str,
) -> None:
    """The host's main: build the engine, then answer requests until shutdown or a closed
    pipe. Errors go back as ("error", exception), start failures included."""
    enter_host(env, log)
    engine = None
    try:
        try:
            engine = start(kwargs)
            started: tuple[str, Any] = ("ok", None)
        except BaseException as e:  # the start's reason, raised in the parent
            started = ("error", _picklable(e))
        while True:
            request = conn.recv()
            if request[0] == "shutdown":
                break
            if request[0] == "ready" or engine is None:
                conn.send(started)
                if engine is None:
                    break
                continue
            try:
                if request[0] == "generate":
                    conn.send(("ok", engine.generate(**request[1])))
                elif request[0] == "flush_cache":
                    conn.send(("ok", engine.flush_cache()))
                else:
                    conn.send(("ok", engine.collective_rpc(request[1], **request[2])))
            except BaseException as e:
                conn.send(("error", _picklable(e)))
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the parent is gone or stopping: shut down below
    finally:
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.shutdown()
        with contextlib.suppress(OSError):
            conn.send(("ok", None))
        conn.close()
