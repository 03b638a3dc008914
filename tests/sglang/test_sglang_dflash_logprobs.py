"""dflash_logprobs against the real sglang 0.5.17 and 0.5.23 wheels (CPU).

- The patched 0.5.17 scheduler check takes a request that returns logprobs (stock aborts it),
  and the patched worker no longer refuses a batch that returns them: its prefill reaches the
  target's ordinary forward with the batch still asking for logprobs; removing the patch puts
  SGLang's refusals back.
- The logprob step the patched worker runs after the accept (`chain_logprobs`), fed verify
  logits of bs x block rows, the committed tokens and accept lengths, gives per committed token
  the bits SGLang 0.5.17's own plain greedy decode gives for that row (`Sampler.forward` on the
  one row, torch.equal), top-k and token-id logprobs included, also as the scheduler hands
  them to the request (`_apply_decode_logprobs`); and the same bits as 0.5.23's own DFLASH
  step (`compute_spec_logprobs` with `chain_stride`), run on the same inputs in the same run.
What needs a GPU: the verify's logits rows equal to decode's (the exactness patches), a real
DFLASH engine's requests carrying these logprobs (`benchmarks/bench_sglang.py`, matrix phase).
"""

from __future__ import annotations

import json
import struct

import pytest

from specdash.runs.sglang.patches import dflash_logprobs

PATCH_SCRIPT = """
import inspect, json
from types import SimpleNamespace
import sglang.srt.managers.scheduler as scheduler
from sglang.srt.speculative import dflash_utils, dflash_worker_v2
from specdash.runs.sglang.patches import dflash_logprobs

Worker = dflash_worker_v2.DFlashWorkerV2
req = SimpleNamespace(return_logprob=True, return_hidden_states=False)

class TargetForward(Exception):
    pass

seen = []

def target_forward(batch, capture_hidden_mode=None):
    seen.append(batch.return_logprob)
    raise TargetForward

worker = SimpleNamespace(
    target_worker=SimpleNamespace(forward_batch_generation=target_forward),
    _validate_phase1_sampling_support=lambda batch: None,
)
prefill = SimpleNamespace(
    return_logprob=True, forward_mode=SimpleNamespace(is_extend=lambda: True),
    is_extend_in_batch=False,
)

def state():
    try:
        Worker.forward_batch_generation(worker, prefill)
        reached = "returned"
    except TargetForward:
        reached = "target forward"
    except ValueError as e:
        reached = str(e)
    source = inspect.getsource(Worker.forward_batch_generation)
    return {
        "utils": dflash_utils.validate_dflash_request(req, True),
        "scheduler": scheduler.validate_dflash_request(req, False),
        "hidden": scheduler.validate_dflash_request(
            SimpleNamespace(return_logprob=True, return_hidden_states=True), True),
        "prefill": reached,
        "calls_step": "chain_logprobs(batch, logits_output, out_tokens, block_size)" in source,
    }

out = {"stock": state()}
dflash_logprobs.PATCH.apply()
out["patched"] = state()
out["seen"] = seen
dflash_logprobs.PATCH.remove()
out["removed"] = state()
print("RESULT " + json.dumps(out))
"""

REFUSAL = "DFLASH speculative decoding does not support return_logprob yet."
HIDDEN = "DFLASH speculative decoding does not support return_hidden_states yet."


def result(proc) -> dict:
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])


def test_patched_0_5_17_takes_logprob_requests_and_removes_cleanly(run_each_sglang) -> None:
    if run_each_sglang.version != "0.5.17":
        assert dflash_logprobs.PATCH.variant("0.5.23").rebindings == ()
        source = (run_each_sglang.wheel / "sglang/srt/speculative/dflash_utils.py").read_text()
        assert "does not support return_logprob" not in source  # 0.5.23 takes them
        return
    r = result(run_each_sglang(PATCH_SCRIPT))
    stock = {
        "utils": REFUSAL,
        "scheduler": REFUSAL,
        "hidden": REFUSAL,
        "prefill": REFUSAL,
        "calls_step": False,
    }
    assert r["stock"] == stock and r["removed"] == stock
    assert r["patched"] == {
        "utils": None,
        "scheduler": None,
        "hidden": HIDDEN,
        "prefill": "target forward",
        "calls_step": True,
    }
    assert r["seen"] == [True]  # the target's prefill forward still returns logprobs


def test_worker_edits_need_each_text_exactly_once(run_each_sglang) -> None:
    module = run_each_sglang.wheel / "sglang/srt/speculative/dflash_worker_v2.py"
    source = module.read_text()
    if run_each_sglang.version != "0.5.17":
        with pytest.raises(ValueError, match="found 0x"):
            dflash_logprobs.with_logprobs(source)
        return
    edited = dflash_logprobs.with_logprobs(source)
    compile(edited, str(module), "exec")
    assert REFUSAL not in edited and edited.count("chain_logprobs(") == 1
    with pytest.raises(ValueError, match="found 2x"):
        dflash_logprobs.with_logprobs(source + dflash_logprobs.LOGPROB_EDITS[0][0])


STEP_SCRIPT = """
import json, struct
from types import SimpleNamespace
import sglang
import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput

torch.manual_seed(0)
bs, block, vocab = 3, 4, 4096
accepted = [0, 2, 3]  # correct drafts per request: it commits accepted + 1 tokens
tops = [0, 2, 5]
token_ids = [None, [3, 50], None]
logits = torch.randn(bs * block, vocab) * 3
logits[4:8, :100] = float("-inf")  # request 1's masked ids: clamped at the dtype's min
out_tokens = logits.view(bs, block, vocab).argmax(-1)
for b, a in enumerate(accepted):
    out_tokens[b, a + 1:] = 0  # past the commit, as SGLang fills it
batch = SimpleNamespace(
    seq_lens=torch.zeros(bs, dtype=torch.int64), sampling_info=SimpleNamespace(is_all_greedy=True),
    top_logprobs_nums=tops, token_ids_logprobs=token_ids, return_logprob=True,
)
spec = LogitsProcessorOutput(next_token_logits=logits.clone())
if sglang.__version__ == "0.5.17":
    from specdash.runs.sglang.patches.dflash_logprobs import chain_logprobs

    chain_logprobs(batch, spec, out_tokens, block)
else:
    from sglang.srt.layers.logprob_processor import compute_spec_logprobs

    compute_spec_logprobs(batch, spec, out_tokens.reshape(-1), chain_stride=block)

def hexes(t):
    return [struct.pack("<f", x).hex() for x in t.reshape(-1).tolist()]

rows = [b * block + j for b in range(bs) for j in range(accepted[b] + 1)]
out = {
    "shape": list(spec.next_token_logprobs.shape),
    "dtype": str(spec.next_token_logprobs.dtype),
    "bits": {r: hexes(spec.next_token_logprobs.reshape(-1)[r]) for r in rows},
    "top": {r: [hexes(spec.next_token_top_logprobs_val[r]),
                spec.next_token_top_logprobs_idx[r].tolist()] for r in rows},
    "token_ids": {r: hexes(torch.tensor(spec.next_token_token_ids_logprobs_val[r]))
                  for r in rows if token_ids[r // block]},
}
if sglang.__version__ == "0.5.17":
    # plain greedy decode of each committed row, through SGLang's own sampler (its __init__
    # wants a TP group; the forward needs only the logprob processor)
    from sglang.srt.layers.logprob_processor import OutputLogprobProcessor
    from sglang.srt.layers.sampler import Sampler
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )

    sampler = Sampler.__new__(Sampler)
    sampler.output_logprob_processor = OutputLogprobProcessor()
    greedy = SimpleNamespace(is_all_greedy=True, has_custom_logit_processor=False,
                             return_sampling_masks=None, grammars=None)
    equal, plain_lp = {}, {}
    for r in rows:
        b, j = divmod(r, block)
        plain = LogitsProcessorOutput(next_token_logits=logits[r : r + 1].clone())
        ids = Sampler.forward(sampler, plain, greedy, True, [tops[b]], [token_ids[b]],
                              torch.zeros(1, dtype=torch.int64))
        checks = [int(ids[0]) == int(out_tokens[b, j]),
                  torch.equal(plain.next_token_logprobs[0], spec.next_token_logprobs[b, j])]
        if tops[b]:
            checks += [torch.equal(plain.next_token_top_logprobs_val[0],
                                   spec.next_token_top_logprobs_val[r]),
                       torch.equal(plain.next_token_top_logprobs_idx[0],
                                   spec.next_token_top_logprobs_idx[r])]
        if token_ids[b]:
            checks.append(torch.equal(torch.tensor(plain.next_token_token_ids_logprobs_val[0]),
                                      torch.tensor(spec.next_token_token_ids_logprobs_val[r])))
        equal[r] = checks
        plain_lp.setdefault(b, []).append(plain.next_token_logprobs[0].item())
    out["equal_plain"] = equal
    # the scheduler's hand-over to each request (spec v2: row i of [bs, block], top-k i*block+j)
    spec.next_token_logprobs = spec.next_token_logprobs.tolist()
    spec.next_token_top_logprobs_val = [v.tolist() for v in spec.next_token_top_logprobs_val]
    spec.next_token_top_logprobs_idx = [x.tolist() for x in spec.next_token_top_logprobs_idx]
    handed = {}
    for b in range(bs):
        lp = SimpleNamespace(output_token_logprobs_val=[], output_token_logprobs_idx=[],
                             top_logprobs_num=tops[b], output_top_logprobs_val=[],
                             output_top_logprobs_idx=[], token_ids_logprob=None)
        SchedulerBatchResultProcessor._apply_decode_logprobs(
            None, req=SimpleNamespace(logprob=lp), i=b,
            batch=SimpleNamespace(spec_algorithm=SimpleNamespace(is_none=lambda: False)),
            next_token_id=out_tokens[b, : accepted[b] + 1].tolist(),
            next_token_logprobs=spec.next_token_logprobs, logits_output=spec)
        handed[b] = [lp.output_token_logprobs_val == plain_lp[b],
                     lp.output_token_logprobs_idx == out_tokens[b, : accepted[b] + 1].tolist(),
                     len(lp.output_top_logprobs_val) == (accepted[b] + 1 if tops[b] else 0)]
    out["handed"] = handed
print("RESULT " + json.dumps(out))
"""


def test_chain_logprobs_give_plain_decode_bits_and_0_5_23s(run_release) -> None:
    r = {version: result(run_release(version)(STEP_SCRIPT)) for version in ("0.5.17", "0.5.23")}
    port, reference = r["0.5.17"], r["0.5.23"]
    committed = 1 + 3 + 4
    assert port["shape"] == [3, 4] and port["dtype"] == "torch.float32"
    assert len(port["equal_plain"]) == committed
    assert all(all(checks) for checks in port["equal_plain"].values()), port["equal_plain"]
    assert [len(c) for c in port["equal_plain"].values()] == [2, 5, 5, 5, 4, 4, 4, 4]
    assert all(all(v) for v in port["handed"].values()), port["handed"]
    for key in ("shape", "dtype", "bits", "top", "token_ids"):
        assert port[key] == reference[key], key
    clamped = struct.pack("<f", -3.4028234663852886e38).hex()  # fp32's min: masked ids
    assert port["token_ids"] and all(bits == [clamped] * 2 for bits in port["token_ids"].values())
