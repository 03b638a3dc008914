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
from specdash.runs.sglang.patches import patch_set, registry
from specdash.registry import algorithms
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
for algo in algorithms.NAMES:
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
    left_on = sorted(
        ["dflash_logprobs", "fp8_routing", "gemm_routing", *always]
        + ["verify_attention_as_decode_rows"]
    )
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


TOP_LOGPROBS_SCRIPT = r"""
import asyncio, dataclasses, inspect, json, pathlib, types
import torch
import specdash
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager
from specdash.runs.sglang import backend, process

torch.manual_seed(0)
ROWS = torch.randn(3, 4, 50).log_softmax(-1)  # per prompt, per token: its fp32 logprob row


class Detokenized(dict):
    # what the detokenizer sends for a request (BatchStrOutput's logprob fields), None the rest
    __getattr__ = dict.get


class Manager:
    # SGLang's tokenizer manager without its scheduler: the request normalized as the real one
    # does, each output's meta_info built by the real convert_logprob_style
    def __init__(self):
        self.requests, self.real = [], TokenizerManager.__new__(TokenizerManager)

    async def generate_request(self, obj, request=None):
        obj.normalize_batch_and_arguments()
        self.requests.append(obj)
        outs = []
        for i in range(obj.batch_size):
            sub, rows = obj[i], ROWS[i]
            ids = rows.argmax(-1)
            top = rows.topk(max(sub.top_logprobs_num, 1), dim=-1)
            sent = Detokenized(
                input_token_logprobs_val=[[]], input_token_logprobs_idx=[[]],
                output_token_logprobs_val=[rows.gather(1, ids[:, None])[:, 0].tolist()],
                output_token_logprobs_idx=[ids.tolist()],
                input_top_logprobs_val=[[]], input_top_logprobs_idx=[[]],
                output_top_logprobs_val=[top.values[:, : sub.top_logprobs_num].tolist()],
                output_top_logprobs_idx=[top.indices[:, : sub.top_logprobs_num].tolist()],
            )
            fields = dataclasses.fields(ReqState)
            state = types.SimpleNamespace(obj=sub, **{
                f.name: f.default_factory() for f in fields
                if f.default_factory is not dataclasses.MISSING})
            meta = {"id": sub.rid}
            extra = {"finished": True}
            if "finished" not in inspect.signature(self.real.convert_logprob_style).parameters:
                extra = {}
            self.real.convert_logprob_style(
                meta, state, sub.top_logprobs_num, sub.token_ids_logprob,
                sub.return_text_in_logprobs, sent, 0, **extra)
            outs.append({"output_ids": ids.tolist(), "meta_info": meta})
        yield outs


engine = object.__new__(process.patched_engine_class())  # the real class, not started
engine.tokenizer_manager, engine.loop = Manager(), asyncio.new_event_loop()
shadow = backend.generate(engine, ["a"], ["r-shadow"], 4, backend.SHADOW_TOP_LOGPROBS)
spec = backend.generate(engine, ["a", "b"], ["r-0", "r-1"], 4)
before = GenerateReqInput(text=["a", "b"], rid=["r-0", "r-1"], return_logprob=True,
                          sampling_params={"temperature": 0.0, "max_new_tokens": 4})
before.normalize_batch_and_arguments()
top2 = ROWS[0].topk(2, dim=-1)
request_fields = lambda obj: repr([getattr(obj, f.name) for f in dataclasses.fields(obj)])
shadow_obj, spec_obj = engine.tokenizer_manager.requests
# the dtype the margin is judged by, as the engine's real model config resolves it
target = str(pathlib.Path(specdash.__file__).parent / "data" / "target")  # an fp32 checkpoint
dtypes = {}
for arg in ("auto", "bfloat16"):
    engine.tokenizer_manager.model_config = ModelConfig(model_path=target, dtype=arg)
    dtypes[arg] = process.engine_dtype(engine)
print("RESULT " + json.dumps({
    "shadow_top_logprobs_num": shadow_obj.top_logprobs_num,
    "shadow_logprobs": shadow[0].logprobs,
    "shadow_top": shadow[0].top,
    "expected_top": [list(zip(i, v)) for i, v in
                     zip(top2.indices.tolist(), top2.values.tolist())],
    "spec_top": [o.top for o in spec],
    "spec_unchanged": request_fields(spec_obj) == request_fields(before),
    "dtypes": dtypes,
}))
"""


def test_the_shadows_top_logprobs_through_the_real_request(run_each_sglang) -> None:
    """The shadow's top-2 through each release's real `Engine.generate`, request object and
    tokenizer manager (`convert_logprob_style`: what a scheduler sends, per token the top values
    and ids as fp32 read into Python floats, into `meta_info`); only the scheduler is replaced.
    The shadow's request asks for 2, the speculative one's is the request it was before, the
    pairs specdash reads back are the scheduler's, bit for bit, and the dtype the margin is
    judged by is the one the engine's real model config resolves."""
    proc = run_each_sglang(TOP_LOGPROBS_SCRIPT)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["shadow_top_logprobs_num"] == [2]
    expected = [[[t, v] for t, v in row] for row in r["expected_top"]]
    assert r["shadow_top"] == expected  # JSON keeps a double's exact value
    assert [row[0][1] for row in r["shadow_top"]] == r["shadow_logprobs"]  # top-1: the token's
    assert r["spec_top"] == [[[]] * 4, [[]] * 4]  # none asked, none read
    assert r["spec_unchanged"]
    # "auto" is SGLang's choice for the checkpoint (fp32 weights run in float16), not specdash's
    assert r["dtypes"] == {"auto": "float16", "bfloat16": "bfloat16"}
