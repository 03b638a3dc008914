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
