"""A stand-in for `sglang.Engine` (the real one needs CUDA), importable by name, so the
session's shadow engine can be built from it in its spawned host process too. Each engine
writes what it was given and asked to `$WORKDIR/engine-<pid>-<n>.json` when it shuts down."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

from specdash.engine_patches import memory_pools_in_turn, telemetry

IDS = [[5, 6, 7, 8, 9], [1, 2, 3]]
STEPS = [[(2, [6, 7, 8]), (0, [9])], [(1, [2, 3])]]  # (accepted drafts, emitted) per step
LOGPROBS = [[-0.5, -1.25, -0.75, -2.0, -0.125], [-0.25, -3.0, -1.5]]
PROMPTS = ["first prompt", "second prompt"]


def next_float(x: float) -> float:
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return struct.unpack("<f", struct.pack("<I", bits + 1))[0]


class StandInEngine:
    made = 0

    def __init__(self, **kw):
        self.kw = {k: v for k, v in kw.items() if k != "custom_sigquit_handler"}
        self.tokenizer_manager = type("TM", (), {"tokenizer": None})()
        self.rpcs = []
        self.batches = []
        self.warm_ups = []
        self.flushes = 0
        self.pool_turn = os.environ.get(memory_pools_in_turn.TURN_ENV)  # its schedulers inherit it
        StandInEngine.made += 1
        self.record = Path(os.environ["WORKDIR"]) / f"engine-{os.getpid()}-{self.made}.json"

    def generate(self, prompt, sampling_params, return_logprob, rid):
        """A batch of requests (lists, as the session sends them). The speculative engine
        reports their verify steps interleaved, step 0 of every request first, as a scheduler
        running them together does."""
        if prompt[0] not in PROMPTS:  # the session's warm-up request
            self.warm_ups.append((prompt, sampling_params["max_new_tokens"]))
            return [{"output_ids": [7], "meta_info": {"output_token_logprobs": [(-0.5, 7, "x")]}}]
        self.batches.append(len(prompt))
        which = [PROMPTS.index(p) for p in prompt]
        if "speculative_algorithm" in self.kw:
            for step in range(max(len(STEPS[i]) for i in which)):
                for i, r in zip(which, rid, strict=True):
                    if step < len(STEPS[i]):
                        accepted, emitted = STEPS[i][step]
                        telemetry._emit(
                            {"rid": r, "k": 2, "accepted": accepted, "emitted": emitted,
                             "drafts": None, "verify_s": 0.002, "draft_s": None}
                        )  # fmt: skip
            time.sleep(0.2)
        outs = []
        for i in which:
            lps = list(LOGPROBS[i])
            if "speculative_algorithm" not in self.kw and i == 1:
                lps[2] = next_float(lps[2])  # shadow differs in one logprob's last bit
            triples = [(lp, t, f"<{t}>") for lp, t in zip(lps, IDS[i], strict=True)]
            outs.append({"output_ids": IDS[i], "meta_info": {"output_token_logprobs": triples}})
        return outs

    def collective_rpc(self, method, **kw):
        self.rpcs.append((method, kw))

    def flush_cache(self):
        self.flushes += 1
        return True

    def shutdown(self):
        state = {"kw": self.kw, "rpcs": self.rpcs, "shut": True, "pid": os.getpid()}
        state["batches"] = self.batches
        state["warm_ups"], state["flushes"] = self.warm_ups, self.flushes
        state["pool_turn"] = self.pool_turn
        self.record.write_text(json.dumps(state))


def engine_class() -> type:
    """What the session calls for `patched_engine_class` (a module-level function: it pickles
    by name into the shadow's host process)."""
    return StandInEngine


def recorded(workdir: Path) -> list[dict]:
    """The engines' records, the speculative one first."""
    states = [json.loads(p.read_text()) for p in sorted(workdir.glob("engine-*.json"))]
    return sorted(states, key=lambda s: "speculative_algorithm" not in s["kw"])
