"""Two engines starting on one GPU size their memory pools in turn.

Why: SGLang sizes an engine's KV and mamba pools as the memory free now minus
`(1 - mem_fraction_static)` x the memory that was free before its weights loaded
(`KVCacheConfigurator._profile_available_bytes`, 0.5.17 and 0.5.23). A specdash session starts
its speculative engine and its shadow at the same time; unpatched, each reads "before" on an
empty GPU and "now" after the other has taken its pools, so the difference goes negative and
both starts fail: "Not enough GPU memory for hybrid (mamba/linear-attention) state cache"
(docs/PERF.md, the parallel start). Engines started one after the other never meet it.

The patch holds an exclusive `flock` on the file `TURN_ENV` names from the first "before"
reading (`ModelRunner.init_torch_distributed`, the draft's included) until the pools exist
(`Scheduler.init_memory_pools` returns): the second engine reads "before" after the first has
allocated, as if it had started after it. Spawning, imports and CUDA graph captures still
overlap. Only the first rank of an engine takes the lock (`scheduler_entry` clears the variable
elsewhere): its other ranks wait for it in their collectives, and a lock per rank would deadlock
them. A process that dies holding the lock releases it with its file descriptor. Without
`TURN_ENV` (one engine) the wrappers only call through.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from specdash.runs.sglang.patches.registry import Patch, Rebinding, Target, Variant

logger = logging.getLogger(__name__)

TURN_ENV = "SPECDASH_SGLANG_POOL_TURN"
"""The lock file's path; set by a session whose two engines start at the same time."""
_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_PROFILE = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes"
_held: int | None = None
"""The lock file's descriptor while this process holds its turn."""


def take_turn() -> float:
    """Wait for the lock (once per process); returns the seconds waited."""
    global _held
    path = os.environ.get(TURN_ENV)
    if not path or _held is not None:
        return 0.0
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    t0 = time.perf_counter()
    fcntl.flock(fd, fcntl.LOCK_EX)
    _held = fd
    waited = time.perf_counter() - t0
    logger.info("specdash: memory pools' turn after %.1f s waiting for the other engine", waited)
    return waited


def end_turn() -> None:
    """Release the lock; this process never takes it again (a later model runner's reading
    must not wait for, or hold up, the other engine)."""
    global _held
    os.environ.pop(TURN_ENV, None)
    if _held is not None:
        fcntl.flock(_held, fcntl.LOCK_UN)
        os.close(_held)
        _held = None


def _turn_first(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_torch_distributed(self: Any, *args: Any, **kwargs: Any) -> Any:
        take_turn()
        return original(self, *args, **kwargs)

    return init_torch_distributed


def _turn_ends(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_memory_pools(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            end_turn()

    return init_memory_pools


def _variant(runner: str, pools: str, profile: str) -> Variant:
    return Variant(
        targets=(
            Target(f"{_RUNNER}.init_torch_distributed", runner),
            Target(f"{_SCHEDULER}.init_memory_pools", pools),
            Target(_PROFILE, profile, role="relied on"),
        ),
        rebindings=(
            Rebinding(_RUNNER, "init_torch_distributed", _turn_first),
            Rebinding(_SCHEDULER, "init_memory_pools", _turn_ends),
        ),
    )


PATCH = Patch(
    name="memory_pools_in_turn",
    flag="pools-in-turn",
    summary="engines starting together on one GPU size their memory pools one after the other",
    always=True,
    variants={
        "0.5.17": _variant(
            "dc28ad5506ea404480485fc8657bc91773c5a41c3d4d81eb9377ecaf68542bb5",
            "87e788d9ce60ebafc33941f8952974740a45fa1805f2dd6c057f7afb43be007a",
            "44968c414b76caa90112af4cadc778b6c56d048e2480c814e78e1a1e15137eeb",
        ),
        "0.5.23": _variant(
            "0b48462df7662a69e81e472c1d04d84086fa35c9530fa2f17dd1b6f45707737d",
            "7ebfad477e8d8f444a8b0fad952dfc13e7b115ddab6cd3c67a57ff340eb41dcd",
            "9dee439ccf67ca31740fc327c56c0348e5cef90d50bf365b7ec11b0e0de99226",
        ),
    },
)
