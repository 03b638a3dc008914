"""The exactness patches on SGLang's own Triton kernels (0.5.17 and 0.5.23), run by the Triton
interpreter (TRITON_INTERPRET=1) on tiny shapes; both scripts share one subprocess per release.

GDN: decode runs token by token through `GDNKernelDispatcher`, branching exactly as
`GDNAttnBackend.forward_decode` does (packed kernel when the dispatcher says so); verify runs
the n tokens at once through `GDNKernelDispatcher.target_verify`. Patched, the per-token
outputs and the fp32 state after the last token are equal (torch.equal); unpatched (packed
decode, bf16-rounded beta) they are not, which is why the patch exists.

Verify rows: the bs*n verify rows equal, bit for bit, a plain decode batch in which each row is
its own sequence of length seq_len + i + 1, with the split counts SGLang's own
`TritonAttnBackend.get_num_kv_splits` picks in deterministic mode (0.5.23: the table from the
verify metadata; 0.5.17: the graph-capturable table from `req_to_token`).
"""

from __future__ import annotations

import json

import pytest

GDN_SCRIPT = r"""
import json
import torch
import triton
import triton.language as tl

import sglang
from sglang.kernels.ops.attention.fla import fused_recurrent
from sglang.srt.layers.attention.linear.gdn_backend import GDNKernelDispatcher
from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
from specdash.engine_patches import gdn_verify_as_decode as gdn

NEW = sglang.__version__ == "0.5.23"
if NEW:  # 0.5.17 launches GDN decode and verify alike: no launch config to pin
    from sglang.kernels.ops.attention.linear import fused_sigmoid_gating_recurrent as launch


@triton.jit
def _exp(x):  # the interpreter cannot call fla.op.exp (a bare tl.exp alias) from a kernel
    return tl.exp(x)


fused_recurrent.exp = _exp
torch.manual_seed(0)
B, H, HV, K, V, N = 1, 1, 2, 16, 16, 3
bf16 = torch.bfloat16
q, k = torch.randn(N, B, H, K, dtype=bf16), torch.randn(N, B, H, K, dtype=bf16)
v = torch.randn(N, B, HV, V, dtype=bf16)
a, b = torch.randn(N, B, HV, dtype=bf16), torch.randn(N, B, HV, dtype=bf16)
A_log, dt_bias = torch.randn(HV), torch.randn(HV)
state0 = torch.randn(2, HV, V, K) * 0.1  # fp32 SSM state pool, slot 1 in use
slot = torch.tensor([1], dtype=torch.int32)


def dispatcher():
    triton_backend = LinearAttnKernelBackend.TRITON
    return GDNKernelDispatcher(triton_backend, triton_backend)


def decode(d):
    state, outs = state0.clone(), []
    for t in range(N):
        if d.supports_packed_decode:
            mixed = torch.cat([q[t].reshape(B, -1), k[t].reshape(B, -1), v[t].reshape(B, -1)], -1)
            o = d.packed_decode(mixed, a[t], b[t], A_log=A_log, dt_bias=dt_bias,
                                scale=K**-0.5, ssm_states=state, cache_indices=slot,
                                num_v_heads=HV, head_v_dim=V)
        else:
            o = d.decode(q[t][None], k[t][None], v[t][None], a[t], b[t], A_log=A_log,
                         dt_bias=dt_bias, ssm_states=state, cache_indices=slot,
                         query_start_loc=torch.arange(B + 1, dtype=torch.int32))
        outs.append(o.reshape(B, HV, V))
    return torch.stack(outs), state[1]


def verify(d):
    state = state0.clone()
    steps = torch.zeros(1, N, HV, V, K)
    o = d.target_verify(A_log, dt_bias, q.reshape(1, N, H, K), k.reshape(1, N, H, K),
                        v.reshape(1, N, HV, V), a.reshape(N, HV), b.reshape(N, HV),
                        ssm_states=state, cache_indices=slot,
                        query_start_loc=torch.tensor([0, N], dtype=torch.int32),
                        intermediate_states_buffer=steps,
                        intermediate_state_indices=torch.tensor([0], dtype=torch.int32),
                        cache_steps=N, retrieve_parent_token=None)
    assert torch.equal(state, state0), "verify must not write the state pool"
    return o.reshape(N, B, HV, V), steps[0, N - 1]


def compare():
    d = dispatcher()
    (od, sd), (ov, sv) = decode(d), verify(d)
    return {"packed": d.supports_packed_decode, "out_equal": torch.equal(od, ov),
            "state_equal": torch.equal(sd, sv),
            "out_max_diff": (od.float() - ov.float()).abs().max().item()}


def launches():
    if not NEW:
        return None
    launch._is_sm90 = True  # as on an H100/H200, where verify gets its own narrow launch
    select = launch._select_recurrent_launch_config
    return [list(select(1, 16, 32, 128, 128, False, target_verify=tv)) for tv in (False, True)]


result = {"unpatched": compare(), "unpatched_launch": launches()}
gdn.PATCH.apply()
result["patched"] = compare()
result["patched_launch"] = launches()
gdn.PATCH.remove()
result["removed_launch"] = launches()
print("GDN " + json.dumps(result))
"""


ROWS_SCRIPT = """
import json
from types import SimpleNamespace
import torch

from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from specdash.engine_patches.verify_attention_as_decode_rows import ROW_KERNELS

rows_kernel = ROW_KERNELS[sglang.__version__]["TritonAttnBackend"][0]

torch.manual_seed(0)
H, HKV, D, TILE, MAX_CTX, SLOTS = 2, 1, 16, 4, 32, 64
k_buf, v_buf = torch.randn(SLOTS, HKV, D), torch.randn(SLOTS, HKV, D)
req_to_token = torch.randperm(SLOTS)[: 2 * MAX_CTX].reshape(2, MAX_CTX).to(torch.int32)
backend = SimpleNamespace(
    split_tile_size=TILE, page_size=1, max_kv_splits=MAX_CTX // TILE,
    enable_deterministic=True, static_kv_splits=False, device_core_count=132,
    req_to_token_pool=SimpleNamespace(req_to_token=req_to_token), req_to_token=req_to_token,
    max_context_len=MAX_CTX, _translate_kv_loc=None, use_pdl=False,
    token_to_kv_pool=SimpleNamespace(get_key_buffer=lambda i: k_buf,
                                     get_value_buffer=lambda i: v_buf),
    decode_attention_fwd=decode_attention_fwd,
)
layer = SimpleNamespace(tp_q_head_num=H, qk_head_dim=D, v_head_dim=D, scaling=D**-0.5,
                        k_scale=None, v_scale=None, logit_capping_method="tanh", logit_cap=0.0,
                        xai_temperature_len=-1, layer_id=0)
bs, n = 2, 3
seq_lens, pools = torch.tensor([5, 9]), torch.tensor([1, 0])
q = torch.randn(bs * n, H * D)
# The draft: request 0 a chain; on 0.5.17 request 1 a tree (candidates 1 and 2 both children of
# 0, as NGRAM's trie gives with two anchors); 0.5.23's rows take chains only.
TREE = sglang.__version__ == "0.5.17"
parents = [[-1, 0, 1], [-1, 0, 0] if TREE else [-1, 0, 1]]



def path(p, i):
    # candidate i and its ancestors, in tree order
    out = []
    while i >= 0:
        out.append(i)
        i = p[i]
    return sorted(out)


# What SGLang hands the verify forward: the prefix slots in the TARGET_VERIFY metadata
# (kv_indptr/kv_indices), the candidates' slots in out_cache_loc (also in req_to_token), and
# the tree mask in SGLang's full layout (request b: [n, seq_len + n], prefix columns all set).
prefix = [req_to_token[pools[b], : seq_lens[b]] for b in range(bs)]
blocks = []
for b in range(bs):
    block = torch.ones(n, int(seq_lens[b]) + n, dtype=torch.bool)
    block[:, int(seq_lens[b]):] = False
    for i in range(n):
        for j in path(parents[b], i):
            block[i, int(seq_lens[b]) + j] = True
    blocks.append(block.flatten())
backend.forward_metadata = SimpleNamespace(
    kv_indptr=torch.tensor([0, 5, 14], dtype=torch.int32),
    kv_indices=torch.cat(prefix).to(torch.int64),
    custom_mask=torch.cat(blocks),
    mask_indptr=torch.tensor([0] + torch.tensor([b.numel() for b in blocks]).cumsum(0).tolist()),
)
out_cache_loc = torch.cat(
    [req_to_token[pools[b], seq_lens[b] : seq_lens[b] + n] for b in range(bs)]
).to(torch.int64)
verify = rows_kernel(backend, q, layer,
                     SimpleNamespace(batch_size=bs, seq_lens=seq_lens, req_pool_indices=pools,
                                     out_cache_loc=out_cache_loc))

# Plain decode: every row its own request reading the prefix and its path, the way
# TritonAttnBackend.forward_decode runs a decode of that token.
indices = [
    torch.cat([prefix[b], out_cache_loc[b * n + torch.tensor(path(parents[b], i))].int()])
    for b in range(bs)
    for i in range(n)
]
lengths = [len(idx) for idx in indices]
kv_indptr = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
splits = torch.empty(len(lengths), dtype=torch.int32)
TritonAttnBackend.get_num_kv_splits(backend, splits, torch.tensor(lengths))
decode = torch.empty_like(q)
decode_attention_fwd(
    q.view(-1, H, D), k_buf, v_buf, decode.view(-1, H, D), kv_indptr,
    torch.cat(indices).to(torch.int64),
    torch.empty(len(lengths), H, backend.max_kv_splits, D),
    torch.empty(len(lengths), H, backend.max_kv_splits),
    splits, backend.max_kv_splits, layer.scaling, 1.0, 1.0,
)
softmax = torch.stack([
    (torch.softmax(q[r].view(H, D) @ k_buf[idx.long(), 0].T * D**-0.5, -1)
     @ v_buf[idx.long(), 0]).reshape(-1)
    for r, idx in enumerate(indices)
])
print("ROWS " + json.dumps({
    "tree": TREE,
    "lengths": lengths,
    "equal": torch.equal(verify, decode),
    "splits": splits.tolist(),
    "max_diff_vs_softmax": (verify - softmax).abs().max().item(),
}))
"""


@pytest.fixture(scope="module")
def interpreted(run_each_sglang) -> dict[str, dict]:
    proc = run_each_sglang(GDN_SCRIPT + ROWS_SCRIPT, env={"TRITON_INTERPRET": "1"})
    results = {}
    for line in proc.stdout.splitlines():
        tag, _, payload = line.partition(" ")
        if tag in ("GDN", "ROWS"):
            results[tag] = json.loads(payload)
    assert set(results) == {"GDN", "ROWS"}, proc.stdout[-2000:]
    results["version"] = run_each_sglang.version
    return results


def test_patched_gdn_decode_equals_verify_bitwise(interpreted) -> None:
    r = interpreted["GDN"]

    assert r["patched"]["packed"] is False
    assert r["patched"]["out_equal"] and r["patched"]["state_equal"], r["patched"]

    assert r["unpatched"]["packed"] is True
    assert not r["unpatched"]["out_equal"], "the unpatched pair must differ, else this test is moot"
    assert not r["unpatched"]["state_equal"]

    if interpreted["version"] == "0.5.23":
        assert r["unpatched_launch"] == [[32, 1], [4, 1]]  # SM90: verify BV=4, decode BV=32
        assert r["patched_launch"] == [[32, 1], [32, 1]]
        assert r["removed_launch"] == [[32, 1], [4, 1]]
    else:
        assert r["unpatched_launch"] is None


def test_verify_rows_equal_sglang_decode_bitwise(interpreted) -> None:
    r = interpreted["ROWS"]
    assert r["tree"] == (interpreted["version"] == "0.5.17")
    # 0.5.17's request 1 is a tree: candidate 2 reads the prefix, 0 and 2 (not 1)
    assert r["lengths"] == ([6, 7, 8, 10, 11, 11] if r["tree"] else [6, 7, 8, 10, 11, 12])
    assert r["equal"]
    assert r["splits"] == [2, 2, 2, 3, 3, 3]  # ceil(len / 4) for lengths 6,7,8,10,11,12
    assert r["max_diff_vs_softmax"] < 1e-5  # and it is attention over the right tokens
