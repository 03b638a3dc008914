"""Telemetry: per-verify-step accepted lengths and GPU timings out of the scheduler, unblocked.

Why: SGLang reports speculative statistics only when a request finishes; the dashboard needs
every verify step as it happens. The hook is an AROUND wrapper on
`SchedulerBatchResultProcessor._resolve_spec_v2_tokens` (0.5.17 and 0.5.23: the wrapped code
differs, the wrapper does not), which runs once per speculative decode batch (EAGLE family,
STANDALONE, NGRAM), overlap or not, after `accept_lens` reached the CPU. It turns the batch
into one plain-dict record per request and hands it to a bounded queue (`put_nowait`, dropped
when full); a daemon thread sends records over ZMQ PUSH with `NOBLOCK`, dropping when the
socket is full. The parent binds the PULL side and exports its address in
`SPECDASH_TELEMETRY_ADDR` before `sglang.Engine` spawns the scheduler.

GPU time comes from `torch.cuda.Event` pairs around `verify`, `draft` and
`_draft_extend_for_decode` of the EAGLE v2 workers (single- and multi-layer); the hook reads
`elapsed_time` only from events that already completed (`query()`), so it never synchronizes.
The draft tokens are copied to pinned memory asynchronously in the same way.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from specdash.runs.sglang.patches.registry import Patch, Rebinding, Target, Variant

logger = logging.getLogger(__name__)

ADDRESS_ENV = "SPECDASH_TELEMETRY_ADDR"
QUEUE_SIZE = 4096

_PROCESSOR = (
    "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
)
_WORKER = "sglang.srt.speculative.eagle_worker_v2"
_MULTI = "sglang.srt.speculative.multi_layer_eagle_worker_v2"


class _Sender:
    """Bounded queue + daemon thread pushing records; every overflow is a counted drop."""

    def __init__(self, address: str, capacity: int = QUEUE_SIZE) -> None:
        self.address, self.capacity = address, capacity
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=capacity)
        self.dropped = 0
        threading.Thread(target=self._run, name="specdash-telemetry", daemon=True).start()

    def put(self, record: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        import zmq

        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, self.capacity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        while True:
            record = self.queue.get()
            record["dropped_before"] = self.dropped
            try:
                sock.send_json(record, flags=zmq.NOBLOCK)
            except zmq.Again:
                self.dropped += 1


_sender: _Sender | None = None


def reports_here() -> bool:
    """Whether this scheduler reports: with tensor parallelism every rank resolves the same
    batch, and only the first sends it (else each verify step would arrive tp_size times)."""
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _emit(record: dict[str, Any]) -> None:
    global _sender
    address = os.environ.get(ADDRESS_ENV)
    if not address or not reports_here():
        return
    if _sender is None or _sender.address != address:
        _sender = _Sender(address)
    _sender.put(record)


class _GpuSpan:
    """A CUDA event pair; `seconds()` is None until the end event has completed."""

    def __init__(self) -> None:
        import torch

        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.start.record()

    def stop(self) -> _GpuSpan:
        self.end.record()
        return self

    def seconds(self) -> float | None:
        return self.start.elapsed_time(self.end) / 1e3 if self.end.query() else None


def _span() -> _GpuSpan | None:
    import torch

    return _GpuSpan() if torch.cuda.is_available() else None


def _stop(span: _GpuSpan | None) -> _GpuSpan | None:
    return span.stop() if span is not None else None


def _seconds(span: _GpuSpan | None) -> float | None:
    return span.seconds() if span is not None else None


def _timed_draft(original: Callable[..., Any]) -> Callable[..., Any]:
    def draft(self, batch, *args, **kwargs):
        span = _span()
        out = original(self, batch, *args, **kwargs)
        batch.specdash_draft_span = _stop(span)
        return out

    return draft


def _timed_verify(original: Callable[..., Any]) -> Callable[..., Any]:
    def verify(self, batch, *args, **kwargs):
        drafts = _copy_drafts(batch)
        span = _span()
        result = original(self, batch, *args, **kwargs)
        result.specdash_verify_span = _stop(span)
        result.specdash_draft_span = getattr(batch, "specdash_draft_span", None)
        result.specdash_drafts = drafts
        return result

    return verify


def _timed_draft_extend(original: Callable[..., Any]) -> Callable[..., Any]:
    def _draft_extend_for_decode(self, batch, batch_output, *args, **kwargs):
        span = _span()
        out = original(self, batch, batch_output, *args, **kwargs)
        batch_output.specdash_draft_extend_span = _stop(span)
        return out

    return _draft_extend_for_decode


def _copy_drafts(batch: Any) -> tuple[Any, Any] | None:
    """Start an async copy of the candidate tokens to pinned memory; (tensor, done event)."""
    import torch

    tokens = getattr(getattr(batch, "spec_info", None), "draft_token", None)
    if tokens is None or not tokens.is_cuda:
        return None
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    host.copy_(tokens, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done


def _drafts_per_request(result: Any, n_reqs: int) -> list[list[int]] | None:
    """Each request's k drafted tokens (root dropped), if the async copy has completed."""
    copied = getattr(result, "specdash_drafts", None)
    if copied is None or not copied[1].query():
        return None
    rows = copied[0].view(n_reqs, -1).tolist()
    return [row[1:] for row in rows]


def build_records(result: Any, batch: Any, accepted_runs: list[list[int]]) -> list[dict[str, Any]]:
    """One record per request of a resolved spec-v2 batch; plain JSON-able values only."""
    k = int(result.speculative_num_draft_tokens) - 1
    drafts = _drafts_per_request(result, len(batch.reqs))
    timing = {
        "draft_s": _seconds(getattr(result, "specdash_draft_span", None)),
        "verify_s": _seconds(getattr(result, "specdash_verify_span", None)),
        "draft_extend_s": _seconds(getattr(result, "specdash_draft_extend_span", None)),
    }
    launch_ts = getattr(batch, "launch_ts", None)
    host_s = time.monotonic() - launch_ts if launch_ts is not None else None
    return [
        {
            "rid": req.rid,
            "forward_iter": int(getattr(batch, "forward_iter", -1)),
            "k": k,
            "accepted": int(result.num_correct_drafts_per_req_cpu[i]),
            "emitted": [int(t) for t in accepted_runs[i]],
            "drafts": drafts[i][:k] if drafts is not None else None,
            "verify_ct": int(req.spec_verify_ct),
            "host_s": host_s,
            "t_ns": time.monotonic_ns(),
            **timing,
        }
        for i, req in enumerate(batch.reqs)
    ]


def _report_after(original: Callable[..., Any]) -> Callable[..., Any]:
    def _resolve_spec_v2_tokens(self, result, batch):
        accepted_runs = original(self, result, batch)
        try:
            for record in build_records(result, batch, accepted_runs):
                _emit(record)
        except Exception:  # telemetry must never take the scheduler down
            logger.exception("specdash telemetry record dropped")
        return accepted_runs

    _resolve_spec_v2_tokens.__specdash_original__ = original  # type: ignore[attr-defined]
    return _resolve_spec_v2_tokens


_PATHS = (
    (_PROCESSOR, "_resolve_spec_v2_tokens", _report_after),
    (f"{_WORKER}.EAGLEWorkerV2", "verify", _timed_verify),
    (f"{_WORKER}.EagleDraftWorker", "draft", _timed_draft),
    (f"{_WORKER}.EagleDraftWorker", "_draft_extend_for_decode", _timed_draft_extend),
    (f"{_MULTI}.MultiLayerEagleWorkerV2", "verify", _timed_verify),
    (f"{_MULTI}.MultiLayerEagleDraftWorker", "draft", _timed_draft),
    (f"{_MULTI}.MultiLayerEagleDraftWorker", "_draft_extend_for_decode", _timed_draft_extend),
)


def _variant(hashes: tuple[str, ...]) -> Variant:
    """Every wrapped method is a target; the hashes are that release's, in _PATHS order."""
    return Variant(
        targets=tuple(
            Target(f"{owner}.{name}", sha)
            for (owner, name, _), sha in zip(_PATHS, hashes, strict=True)
        ),
        rebindings=tuple(Rebinding(owner, name, make) for owner, name, make in _PATHS),
    )


PATCH = Patch(
    name="telemetry",
    flag="telemetry",
    summary="per-verify-step accepted lengths and CUDA-event timings over non-blocking ZMQ",
    variants={
        "0.5.17": _variant(
            (
                "9ca4c74c96e64d4e3145a474082609c76478b2adcbd9ce09efca0488986b62bb",
                "b770b47110ab81e797fe50ae3d48ffe477c0e63e1a8600aa602073e6c8f3a52c",
                "1ba5981308828c1df68533375983738e37f5640aabdb13fea8528b052f61b435",
                "d22e5e9637312c5a9b1b3e1265211f6aa8b61b67648b20c35fca7f0862bfc710",
                "c6046304ffea5a29f729c7b8630285d470a00dd40bfc4f6866a84cd2610003ce",
                "a81a0092ed86aa74f962a9ee6642d13a01234c29996bc4ed550b3638ea596502",
                "84dc70a457591895756fea4d02bc648415de2bcdee803198869abd4bae67f6c4",
            )
        ),
        "0.5.23": _variant(
            (
                "dd103aa7dd424080ceb31724fdeaf8f86719044b8e69ea0d072848e93dab1a14",
                "676b982bca8519d1f5a8526a51c14ed9ffc42bac356e01576370036bc3218c8b",
                "e1d934df4cf2d11dbe2a8f7e68d9748e2fb6b77b6d13c8b32a986afaf0648164",
                "d7858851c429dd624820066fafd1555a66b1940642207aa03ba79fb158b7f434",
                "3ca0cb8deba81edaef55f6b2c7b512882a45ddaf7634ecc1b8e36727f2d360c6",
                "43160192e566bd30de530ff3550b7a624f04bb0cf91c4c46cd8146b9907294d9",
                "27edc3abab2aaedea6b7a822ad5bd19948d03761f2bbb3c04c991b4cf0b54fa1",
            )
        ),
    },
)
