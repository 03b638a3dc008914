"""GDN verify == decode, bit for bit, on SGLang 0.5.23's own Triton kernels (TRITON_INTERPRET=1).

Decode runs token by token through `GDNKernelDispatcher`, branching exactly as
`GDNAttnBackend.forward_decode` does (packed kernel when the dispatcher says so); verify runs
the n tokens at once through `GDNKernelDispatcher.target_verify`. Patched, the per-token
outputs and the fp32 state after the last token are equal (torch.equal); unpatched (packed
decode, bf16-rounded beta) they are not, which is why the patch exists.
"""

from __future__ import annotations

import json

GDN_SCRIPT = r"""
import json
import torch
import triton
import triton.language as tl

from sglang.kernels.ops.attention.fla import fused_recurrent
from sglang.srt.layers.attention.linear.gdn_backend import GDNKernelDispatcher
from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
from specdash.engine_patches import gdn_verify_as_decode as gdn
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
    return GDNKernelDispatcher(triton_backend, triton_backend, triton_backend)


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
    launch._is_sm90 = True  # as on an H100/H200, where verify gets its own narrow launch
    select = launch._select_recurrent_launch_config
    return [list(select(1, 16, 32, 128, 128, False, target_verify=tv)) for tv in (False, True)]


result = {"unpatched": compare(), "unpatched_launch": launches()}
gdn.PATCH.apply()
result["patched"] = compare()
result["patched_launch"] = launches()
gdn.PATCH.remove()
result["removed_launch"] = launches()
print("RESULT " + json.dumps(result))
"""


def test_patched_gdn_decode_equals_verify_bitwise(run_sglang) -> None:
    proc = run_sglang(GDN_SCRIPT, env={"TRITON_INTERPRET": "1"})
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    r = json.loads(line.removeprefix("RESULT "))

    assert r["patched"]["packed"] is False
    assert r["patched"]["out_equal"] and r["patched"]["state_equal"], r["patched"]

    assert r["unpatched"]["packed"] is True
    assert not r["unpatched"]["out_equal"], "the unpatched pair must differ, else this test is moot"
    assert not r["unpatched"]["state_equal"]

    assert r["unpatched_launch"] == [[32, 1], [4, 1]]  # SM90: verify BV=4, decode BV=32
    assert r["patched_launch"] == [[32, 1], [32, 1]]
    assert r["removed_launch"] == [[32, 1], [4, 1]]
