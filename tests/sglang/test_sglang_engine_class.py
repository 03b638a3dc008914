"""The real engine class and scheduler entry, built from each supported SGLang wheel (0.5.17 and
0.5.23), nothing replaced: the class every `--engine sglang` start uses, the keyword arguments
specdash passes (each a real `ServerArgs` field of that release), and the scheduler entry
applying exactly the patches `--sglang-unpatch` leaves on. A `TypeError` like the one that once
stopped every real start (`class X(sglang.Engine)`: a LazyImport) fails here."""

from __future__ import annotations

import json

ENGINE_CLASS_SCRIPT = """
import inspect, json, os, pickle
from pathlib import Path

import sglang
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.server_args import ServerArgs
from specdash.engine_patches import patch_set, registry
from specdash.settings import SessionSettings
from specdash.runs.sglang import args, process as se

cls = se.patched_engine_class()
out = {
    "version": sglang.__version__,
    "row": registry.patch_row(),
    "lazy_engine": type(sglang.Engine).__name__,
    "subclass": issubclass(cls, Engine),
    "entry": cls.run_scheduler_process_func is se.scheduler_entry,
    "detokenizer": cls.run_detokenizer_process_func is se.detokenizer_entry,
    "entry_pickles": pickle.loads(pickle.dumps(cls.run_scheduler_process_func))
    is se.scheduler_entry,
}

fields = set(inspect.signature(ServerArgs).parameters)
settings = SessionSettings(engine="sglang", model=Path("/m"), draft=Path("/d"), k=3)
unknown = {}
for algo in args.ALGORITHMS:
    options = args.SGLangOptions(speculative_algorithm=algo, unpatch=("gdn",))
    for spec in (True, False):
        kw = args.engine_kwargs(settings, options, speculative=spec, split=True, requests=8)
        unknown[f"{algo}/{spec}"] = sorted(set(kw) - fields)
out["unknown_kwargs"] = unknown

# The real scheduler entry: patches from the environment, then SGLang's own entry.
import sglang.srt.managers.scheduler as scheduler
seen = []
scheduler.run_scheduler_process = lambda *a, **k: seen.append(
    sorted(p.name for p in patch_set.all_patches() if p.applied)) or "ran"
os.environ[se.PATCHES_ENV] = ",".join(
    args.applied_patches(args.SGLangOptions(unpatch=("gdn", "telemetry"))))
out["entry_returns"] = se.scheduler_entry(1, key=2)
patch_set.remove_all()
os.environ[se.PATCHES_ENV] = ""
se.scheduler_entry()
out["applied"] = seen
print("RESULT " + json.dumps(out))
"""


def test_real_engine_class_and_scheduler_entry(run_each_sglang) -> None:
    proc = run_each_sglang(ENGINE_CLASS_SCRIPT)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["version"] == r["row"] == run_each_sglang.version
    assert r["lazy_engine"] == "LazyImport"  # why the class comes from its module
    assert r["subclass"] and r["entry"] and r["entry_pickles"] and r["detokenizer"]
    assert r["unknown_kwargs"] == {key: [] for key in r["unknown_kwargs"]}
    assert r["entry_returns"] == "ran"
    always = ["lazy_dsa_import", "memory_pools_in_turn"]  # start-up fixes, always applied
    left_on = sorted(["gemm_routing", *always, "verify_attention_as_decode_rows"])
    assert r["applied"] == [left_on, always]


BATCH_SCRIPT = """
import asyncio, json
from sglang.srt.managers.io_struct import GenerateReqInput
from specdash.runs.sglang import backend, process

seen = []

class TokenizerManager:  # SGLang's tokenizer manager past the real request object
    async def generate_request(self, obj, request):
        assert isinstance(obj, GenerateReqInput)
        obj.normalize_batch_and_arguments()
        subs = [obj[i] for i in range(obj.batch_size)]
        seen.append({
            "single": obj.is_single, "size": obj.batch_size,
            "rids": [s.rid for s in subs], "texts": [s.text for s in subs],
            "logprob": [s.return_logprob for s in subs],
            "params": [s.sampling_params for s in subs],
        })
        yield [
            {"output_ids": [i, i + 1], "meta_info": {"id": s.rid,
             "output_token_logprobs": [(-0.5 * i, i, "a"), (-0.25, i + 1, None)]}}
            for i, s in enumerate(subs)
        ]

engine = object.__new__(process.patched_engine_class())  # the real class, not started
engine.tokenizer_manager = TokenizerManager()
engine.loop = asyncio.new_event_loop()
outs = backend.generate(engine, ["p0", "p1", "p2"], ["r0", "r1", "r2"], max_new_tokens=5)
print("RESULT " + json.dumps({
    "seen": seen,
    "outs": [[o.ids, o.logprobs, o.texts] for o in outs],
}))
"""


def test_a_batch_is_one_generate_call_of_separate_requests(run_each_sglang) -> None:
    """What `--batch N` sends through each release's real `Engine.generate` and request object:
    one call, N requests with their own ids, logprobs asked for each, greedy, and the outputs
    read back in the prompts' order."""
    proc = run_each_sglang(BATCH_SCRIPT)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    (seen,) = r["seen"]
    assert (seen["single"], seen["size"]) == (False, 3)
    assert seen["rids"] == ["r0", "r1", "r2"] and seen["texts"] == ["p0", "p1", "p2"]
    assert seen["logprob"] == [True] * 3
    assert all(p["temperature"] == 0.0 and p["max_new_tokens"] == 5 for p in seen["params"])
    assert r["outs"] == [
        [[0, 1], [-0.0, -0.25], ["a", ""]],
        [[1, 2], [-0.5, -0.25], ["a", ""]],
        [[2, 3], [-1.0, -0.25], ["a", ""]],
    ]
