"""The parent's end of the scheduler's telemetry (`specdash.runs.sglang.patches.telemetry`): per
verify step, per request, over ZMQ; turned into the `VerifyStep` events the native engine emits,
and into each output token's source (drafted, bonus, decoded)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

from specdash.events import TokenSource, VerifyStep
from specdash.settings import VerifyMode


class TelemetryReceiver:
    """PULL end of the scheduler's telemetry; binds before the engine starts (its address
    reaches the scheduler through `process.session_environment`)."""

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
        out: list[dict[str, Any]] = []
        if timeout_ms and not self._sock.poll(timeout_ms):
            return out
        while True:
            try:
                out.append(self._sock.recv_json(flags=self._zmq.NOBLOCK))
            except self._zmq.Again:
                return out

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self._path)


def verify_step_event(
    record: dict[str, Any],
    prompt_index: int,
    step: int,
    verify_mode: VerifyMode,
    gemm_backend: str,
) -> VerifyStep:
    """A telemetry record as the VerifyStep the native engine emits; `step`: the session step
    whose batch of requests it belongs to (`VerifyStep.step`).

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


def token_sources(accepted_per_step: list[int], n_tokens: int) -> Iterator[TokenSource]:
    """The source of each output token: the prefill's token, then each verify step's accepted
    drafts and its bonus token."""
    if n_tokens == 0:
        return
    yield "decode"
    produced = 1
    for accepted in accepted_per_step:
        for i in range(accepted + 1):
            if produced == n_tokens:
                return
            yield "bonus" if i == accepted else "draft"
            produced += 1
    while produced < n_tokens:  # steps whose telemetry was dropped
        yield "decode"
        produced += 1
