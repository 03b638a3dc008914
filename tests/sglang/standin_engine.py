"""A stand-in for `sglang.Engine` (the real one needs CUDA), importable by name, so the
session's shadow engine can be built from it in its spawned host process too. Each engine
writes what it was given and asked to `$WORKDIR/engine-<pid>-<n>.json` when it shuts down."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import torch

from specdash.runs.sglang.patches import memory_pools_in_turn, telemetry

IDS = [[5, 6, 7, 8, 9], [1, 2, 3]]
STEPS = [[(2, [6, 7, 8]), (0, [9])], [(1, [2, 3])]]  # (accepted drafts, emitted) per step
LOGPROBS = [[-0.5, -1.25, -0.75, -2.0, -0.125], [-0.25, -3.0, -1.5]]
PROMPTS = ["first prompt", "second prompt"]
RUNNER_UP_IDS = [[15, 16, 17, 18, 19], [11, 12, 13]]
"""The second-best token at each position (top-2 logprobs), in both engines."""
RUNNER_UP_GAPS = [[1.0, 0.5, 2.0, 0.25, 3.0], [0.75, 1.5, None]]
"""How far below the chosen token's logprob the runner-up's is; None: one fp32 value below the
shadow's there (`shadow_top2`), the near-tie a divergence at that position sits on."""


def next_float(x: float) -> float:
    """The fp32 value one step further from zero."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return struct.unpack("<f", struct.pack("<I", bits + 1))[0]


def shadow_top2(prompt: int, position: int) -> tuple[tuple[int, float], tuple[int, float]]:
    """The shadow's (token id, logprob) top two at `position` of `prompt`, what a test expects
    its margin from."""
    lp = SHADOW_LOGPROBS[prompt][position]
    gap = RUNNER_UP_GAPS[prompt][position]
    second = next_float(lp) if gap is None else lp - gap
    return (IDS[prompt][position], lp), (RUNNER_UP_IDS[prompt][position], second)


CACHED_TOKENS = [(0, 0), (3, 0)]
"""Prompt tokens (speculative engine, shadow) read from the prefix cache, per prompt."""
SHADOW_LOGPROBS = [list(LOGPROBS[0]), [*LOGPROBS[1][:2], next_float(LOGPROBS[1][2])]]
"""The shadow's logprobs: one differs from the speculative run's in its last bit."""


class StandInTokenizer:
    """Word-length ids for a prompt; `<id>` for a token's text."""

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(f"<{t}>" for t in token_ids)


class StandInEngine:
    made = 0

    def __init__(self, **kw):
        self.kw = {k: v for k, v in kw.items() if k != "custom_sigquit_handler"}
        model_config = type("ModelConfig", (), {"dtype": torch.bfloat16})()
        self.tokenizer_manager = type(
            "TM", (), {"tokenizer": StandInTokenizer(), "model_config": model_config}
        )()
        self.rpcs = []
        self.batches = []
        self.warm_ups = []
        self.top_logprobs_nums = []
        self.flushes = 0
        self.pool_turn = os.environ.get(memory_pools_in_turn.TURN_ENV)  # its schedulers inherit it
        StandInEngine.made += 1
        self.record = Path(os.environ["WORKDIR"]) / f"engine-{os.getpid()}-{self.made}.json"

    def generate(self, prompt, sampling_params, return_logprob, rid, top_logprobs_num=None):
        """A batch of requests (lists, as the session sends them). The speculative engine
        reports their verify steps interleaved, step 0 of every request first, as a scheduler
        running them together does. With `top_logprobs_num` the top logprobs per token, as
        SGLang's tokenizer manager gives them: `(logprob, token id, None)` best first (no text:
        `Engine.generate` cannot ask for `return_text_in_logprobs`)."""
        if prompt[0] not in PROMPTS:  # the session's warm-up request
            self.warm_ups.append((prompt, sampling_params["max_new_tokens"]))
            return [{"output_ids": [7], "meta_info": {"output_token_logprobs": [(-0.5, 7, "x")]}}]
        self.batches.append(len(prompt))
        self.top_logprobs_nums.append(top_logprobs_num)
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
            lps = LOGPROBS[i] if "speculative_algorithm" in self.kw else SHADOW_LOGPROBS[i]
            # no text, as `Engine.generate` gives it: the session decodes the ids itself
            triples = [(lp, t, None) for lp, t in zip(lps, IDS[i], strict=True)]
            cached = CACHED_TOKENS[i]["speculative_algorithm" not in self.kw]
            meta = {"output_token_logprobs": triples, "cached_tokens": cached}
            if top_logprobs_num:
                assert "speculative_algorithm" not in self.kw, "the stand-in knows the shadow's"
                meta["output_top_logprobs"] = [
                    [(lp, t, None) for t, lp in shadow_top2(i, pos)[:top_logprobs_num]]
                    for pos in range(len(IDS[i]))
                ]
            outs.append({"output_ids": IDS[i], "meta_info": meta})
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
        state["top_logprobs_nums"] = self.top_logprobs_nums
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
