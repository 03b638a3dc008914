"""The telemetry hook on SGLang 0.5.23's real `_resolve_spec_v2_tokens`: a constructed spec-v2
batch result goes through the patched method, over ZMQ, and arrives as specdash VerifyStep
events; with no receiver the scheduler side drops records instead of waiting."""

from __future__ import annotations

import json

from specdash.events import VerifyStep, parse_event
from specdash.runs.sglang.telemetry import token_sources, verify_step_event

TELEMETRY_SCRIPT = """
import json, os, time
from types import SimpleNamespace
import torch

from sglang.srt.managers.scheduler_components.batch_result_processor import (
    SchedulerBatchResultProcessor,
)
from sglang.srt.managers.utils import GenerationBatchResult
from specdash.runs.sglang.patches import telemetry
from specdash.runs.sglang.telemetry import TelemetryReceiver, verify_step_event

receiver = TelemetryReceiver()
os.environ[telemetry.ADDRESS_ENV] = receiver.address
telemetry.PATCH.apply()


def req(rid):
    return SimpleNamespace(
        rid=rid, is_retracted=False, finished=lambda: False, grammar=None,
        kv=SimpleNamespace(kv_committed_len=10), spec_verify_ct=0, spec_num_correct_drafts=0,
        update_spec_correct_drafts_histogram=lambda n: None,
    )


# k = 3 drafts per request (4 verify tokens), rows padded to stride 4:
# request A kept 2 drafts + bonus, request B kept none (bonus only).
result = GenerationBatchResult(
    next_token_ids=torch.tensor([11, 12, 13, 0, 21, 0, 0, 0]),
    accept_lens=torch.tensor([3, 1]),
    speculative_num_draft_tokens=4,
)
batch = SimpleNamespace(reqs=[req("rid-a"), req("rid-b")], forward_iter=7,
                        launch_ts=time.monotonic())
scheduler_side = SimpleNamespace(
    metrics_reporter=SimpleNamespace(snapshot_spec_decode_metrics=lambda b, r: None),
    model_worker=SimpleNamespace(on_verify_complete_cpu=lambda *a, **k: None),
    advance_grammar_fsm=lambda r, b: None,
)
tokens = SchedulerBatchResultProcessor._resolve_spec_v2_tokens(scheduler_side, result, batch)
records = []
deadline = time.monotonic() + 10
while len(records) < 2 and time.monotonic() < deadline:
    records += receiver.drain(timeout_ms=100)
events = [verify_step_event(r, i, 0, "exact", "auto").model_dump_json()
          for i, r in enumerate(records)]
telemetry.PATCH.remove()

# No receiver: once the queue and the socket's buffer (8 each) are full, puts drop at once.
sender = telemetry._Sender("ipc:///tmp/specdash-nobody-listens", capacity=8)
t0 = time.perf_counter()
for i in range(200):
    sender.put({"n": i})
put_s = time.perf_counter() - t0
time.sleep(0.5)
print("RESULT " + json.dumps({
    "tokens": tokens, "records": records, "events": events,
    "verify_ct": [r.spec_verify_ct for r in batch.reqs],
    "put_s": put_s, "dropped": sender.dropped,
}))
receiver.close()
"""


def test_hook_turns_batch_result_into_verify_steps(run_sglang) -> None:
    out = run_sglang(TELEMETRY_SCRIPT).stdout
    r = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])

    assert r["tokens"] == [[11, 12, 13], [21]]  # SGLang's own return value, untouched
    assert r["verify_ct"] == [1, 1]
    a, b = r["records"]
    assert (a["rid"], a["k"], a["accepted"], a["emitted"]) == ("rid-a", 3, 2, [11, 12, 13])
    assert (b["rid"], b["k"], b["accepted"], b["emitted"]) == ("rid-b", 3, 0, [21])
    assert a["forward_iter"] == 7 and a["host_s"] >= 0
    assert a["verify_s"] is None and a["drafts"] is None  # no CUDA events/copies on CPU

    steps = [parse_event(e) for e in r["events"]]
    assert all(isinstance(s, VerifyStep) for s in steps)
    assert (steps[0].accepted, steps[0].emitted_tokens) == (2, [11, 12, 13])
    assert steps[0].draft_tokens == [11, 12, -1]  # rejected draft not captured: -1
    assert (steps[1].accepted, steps[1].draft_tokens) == (0, [-1, -1, -1])

    assert 200 - 2 * 8 - 1 <= r["dropped"] < 200
    assert r["put_s"] < 0.5, "putting records must not wait on the socket"


def test_record_with_captured_drafts_and_gpu_times() -> None:
    record = {
        "rid": "x",
        "k": 2,
        "accepted": 1,
        "emitted": [5, 9],
        "drafts": [5, 6],
        "draft_s": 0.001,
        "draft_extend_s": 0.0005,
        "verify_s": 0.004,
    }
    step = verify_step_event(
        record, prompt_index=3, step=4, verify_mode="exact", gemm_backend="deepgemm"
    )
    assert (step.prompt_index, step.step, step.k) == (3, 4, 2)
    assert step.draft_tokens == [5, 6]
    assert step.draft_s == 0.0015 and step.verify_s == 0.004
    assert step.gemm_backend == "deepgemm"


def test_token_sources_follow_the_verify_steps() -> None:
    # prefill token, then steps accepting 2, 0 and 1 drafts, one trailing unreported token
    assert list(token_sources([2, 0, 1], 8)) == [
        "decode",
        "draft",
        "draft",
        "bonus",
        "bonus",
        "draft",
        "bonus",
        "decode",
    ]
    assert list(token_sources([3], 2)) == ["decode", "draft"]
