"""The exactness patches on SGLang's own Triton kernels (0.5.17 and 0.5.23), run by the Triton
interpreter (TRITON_INTERPRET=1) on tiny shapes; both scripts share one subprocess per release.

GDN: decode runs token by token through `GDNKernelDispatcher`, branching exactly as
`GDNAttnBackend.forward_decode` does (packed kernel when the dispatcher says so); verify runs
the n tokens at once through `GDNKernelDispatcher.target_verify`. Patched, the per-token
outputs and the fp32 state after the last token are equal (torch.equal); unpatched (packed
decode, bf16-rounded beta) they are not, which is why the patch exists.

Verify rows: on a draft with a tree (request 1: two children of candidate 0), the bs*n verify
rows equal, bit for bit, a plain decode batch in which each row is its own sequence reading the
prefix and its candidate's path, with the split counts SGLang's own
`TritonAttnBackend.get_num_kv_splits` picks in deterministic mode (0.5.23: the table from the
verify metadata; 0.5.17: the graph-capturable table from `req_to_token`; both take each
candidate's ancestors from the verify tree mask). The chain table gets the branch wrong.

GDN on a draft tree (NGRAM's drafts are trees): the verify conv and recurrent kernels with
SGLang's tree links against decode along each root-to-candidate path, and the chain mode (links
None, what SGLang runs when topk == 1) on the same tree. The recurrent step is exact with the
parents; SGLang's conv tree branch sums its taps in the reverse of decode's order, which is
not; with the GDN patch's conv kernel (taps in decode's order) conv rows, windows, outputs and
fp32 states all are. The patched conv kernel also compiles for sm_90 (TRITON_INTERPRET=0), with
decode's and chain verify's code unchanged.
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
from specdash.runs.sglang.patches import gdn_verify_as_decode as gdn

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
from specdash.runs.sglang.patches.verify_attention_as_decode_rows import ROW_KERNELS

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
# The draft: request 0 a chain, request 1 a tree (candidates 1 and 2 both children of 0, as
# NGRAM's trie gives with two anchors).
parents = [[-1, 0, 1], [-1, 0, 0]]



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
batch = SimpleNamespace(batch_size=bs, seq_lens=seq_lens, req_pool_indices=pools,
                        out_cache_loc=out_cache_loc)
verify = rows_kernel(backend, q, layer, batch)
# The chain table (what a batch without a tree mask gets: candidate i reads 0..i) on this tree
tree_meta = backend.forward_metadata
backend.forward_metadata = SimpleNamespace(**{**vars(tree_meta), "custom_mask": None})
chain = rows_kernel(backend, q, layer, batch)
backend.forward_metadata = tree_meta

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
    "lengths": lengths,
    "equal": torch.equal(verify, decode),
    "chain_rows_equal": [torch.equal(chain[r], decode[r]) for r in range(bs * n)],
    "splits": splits.tolist(),
    "max_diff_vs_softmax": (verify - softmax).abs().max().item(),
}))
"""

TREE_SCRIPT = r"""
import sys
import types

import numpy as np
from triton.runtime import interpreter as _interp

from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

# ngram_worker imports the CUDA op it mirrors; only its host-side twin is used here.
_sk = types.ModuleType("sgl_kernel")
_sk.speculative = types.ModuleType("sgl_kernel.speculative")
_sk.speculative.reconstruct_indices_from_tree_mask = None
sys.modules.setdefault("sgl_kernel", _sk)
sys.modules.setdefault("sgl_kernel.speculative", _sk.speculative)
from sglang.srt.speculative.ngram_worker import _derive_tree_links

# Two fixes to the Triton interpreter (not to SGLang), both needed by the conv kernel:
# a comparison's result is int1 (the interpreter tags it with the left operand's type, so
# `scalar_i64 < n` & a block mask becomes an int64 load mask it then rejects), and bf16
# arithmetic goes through fp32 with round-to-nearest-even back to bf16 (the interpreter
# multiplies the raw uint16 bit patterns, and truncates fp32 -> bf16). A bf16 product is exact
# in fp32, so fp32-then-RNE is the GPU's bf16 multiply, the only bf16 arithmetic here.
_B = _interp.InterpreterBuilder


def _as_int1(op):
    return lambda self, lhs, rhs: _interp.TensorHandle(op(self, lhs, rhs).data, tl.int1)


for _name in dir(_B):
    if _name.startswith(("create_icmp", "create_fcmp")):
        setattr(_B, _name, _as_int1(getattr(_B, _name)))


def _f32(h):
    if h.dtype.scalar == tl.bfloat16:
        return (np.asarray(h.data).astype(np.uint32) << 16).view(np.float32)
    return h.data


def _bf16(a):
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


_cast, _binary = _B.cast_impl, _B.binary_op


def _cast_impl(self, src, dst_type):
    s, d = src.dtype.scalar, dst_type.scalar
    if s == tl.bfloat16 and d == tl.float32:
        return _interp.TensorHandle(_f32(src), tl.float32)
    if s == tl.float32 and d == tl.bfloat16:
        return _interp.TensorHandle(_bf16(src.data), tl.bfloat16)
    return _cast(self, src, dst_type)


def _binary_op(self, lhs, rhs, op):
    if tl.bfloat16 not in (lhs.dtype.scalar, rhs.dtype.scalar):
        return _binary(self, lhs, rhs, op)
    out = op(_f32(lhs), _f32(rhs))
    if out.dtype == np.bool_:
        return _interp.TensorHandle(out, tl.int1)
    return _interp.TensorHandle(_bf16(out), tl.bfloat16)


_B.cast_impl, _B.binary_op = _cast_impl, _binary_op

# The draft tree of the conv kernel's own docstring: candidates 1 and 2 both children of 0,
# 3 a child of 1. SGLang's NGRAM tree mask (row i: i and its ancestors) -> its links.
PARENTS = [-1, 0, 0, 1]
T = len(PARENTS)
H, HV, K, V, WIDTH = 1, 2, 16, 16, 4
DIM = 2 * H * K + HV * V
ONE = torch.tensor([1], dtype=torch.int32)  # the request's state slot
ZERO = torch.tensor([0], dtype=torch.int32)  # its row in the intermediate buffers


def path(i):
    out = []
    while i >= 0:
        out.append(i)
        i = PARENTS[i]
    return out[::-1]


tree_mask = np.zeros((1, T, T), dtype=bool)
for i in range(T):
    tree_mask[0, i, path(i)] = True
next_token, next_sibling = _derive_tree_links(tree_mask, 1, T)

gdn.PATCH.apply()
d = dispatcher()
assert not d.supports_packed_decode
# The conv half of the patch, taken off and put back alone to run SGLang's own conv kernel
# with the rest of the GDN patch on (decode's recurrence unpacked either way).
CONV_FIX = next(r for r in gdn.PATCH.variant().rebindings
                if r.name == "_causal_conv1d_update_kernel")
if NEW:  # 0.5.23 decode's conv on CUDA: the fused projection unpack + conv update
    from sglang.kernels.ops.attention import triton_gdn_fused_proj as fused_proj

    fused_proj.can_use_fused_qkvzba_causal_conv1d_update_contiguous = (
        lambda *a, **kw: (True, "eligible")  # it refuses CPU tensors only
    )


def split(mixed, n):
    q_, k_, v_ = torch.split(mixed, [H * K, H * K, HV * V], -1)
    return q_.reshape(1, n, H, K), k_.reshape(1, n, H, K), v_.reshape(1, n, HV, V)


def recurrent_decode(qkv, g, i):
    # the patched decode step, token by token along root..i (GDNAttnBackend.forward_decode)
    state = g["state0"].clone()
    for t in path(i):
        q_, k_, v_ = (x[:, t : t + 1] for x in qkv)
        o = d.decode(q_, k_, v_, g["a"][t][None], g["b"][t][None], A_log=g["A_log"],
                     dt_bias=g["dt_bias"], ssm_states=state, cache_indices=ONE,
                     query_start_loc=torch.tensor([0, 1], dtype=torch.int32))
    return o.reshape(HV, V), state[1]


def conv_step(g, t, conv):
    # decode's conv of token t (GDNAttnBackend.forward_decode, a 2-D x: one token)
    return causal_conv1d_update(g["x"][t][None].clone(), conv, g["w"], None, "silu",
                                conv_state_indices=ONE)[0]


def fused_conv_step(g, t, conv):
    # 0.5.23 decode's conv on CUDA: fused_qkvzba_causal_conv1d_update_contiguous, fed the
    # projection [qkv | z] and [b | a] of token t
    qkvz = torch.cat([g["x"][t], torch.zeros(HV * V, dtype=g["x"].dtype)])[None]
    ba = torch.zeros(1, 2 * HV, dtype=g["x"].dtype)
    mixed = fused_proj.fused_qkvzba_causal_conv1d_update_contiguous(
        qkvz, ba, conv, g["w"], None, ONE, qkv_dim=DIM, v_dim=HV * V, num_v_heads=HV,
        head_v_dim=V, activation="silu")[0]
    return mixed[0]


def decode(g, i, step=conv_step):
    # conv + recurrent step, token by token along root..i; the conv window after i
    conv = g["conv0"].clone()
    mixed = torch.zeros(T, DIM, dtype=g["x"].dtype)
    for t in path(i):
        mixed[t] = step(g, t, conv)
    return (mixed[i], *recurrent_decode(split(mixed, T), g, i), conv[1].clone())


def verify(g, tree):
    # GDNAttnBackend.forward_extend, target verify: the conv over the T rows with the
    # intermediate windows, then the recurrent verify; the tree links only when topk > 1
    # (HybridLinearAttnBackend), retrieve_parent_token filled by the conv kernel.
    links = (next_token.clone(), next_sibling.clone()) if tree else (None, None)
    parent = torch.empty_like(next_token) if tree else None
    window = torch.zeros(1, T, DIM, WIDTH - 1, dtype=g["x"].dtype)
    mixed = causal_conv1d_update(g["x"][None].transpose(1, 2), g["conv0"].clone(), g["w"],
                                 None, "silu", conv_state_indices=ONE,
                                 intermediate_conv_window=window,
                                 intermediate_state_indices=ZERO,
                                 retrieve_next_token=links[0], retrieve_next_sibling=links[1],
                                 retrieve_parent_token=parent)
    mixed = mixed.transpose(1, 2).reshape(T, DIM)
    qkv = split(mixed, T)
    steps = torch.zeros(1, T, HV, V, K)
    o = d.target_verify(g["A_log"], g["dt_bias"], *qkv, g["a"], g["b"],
                        ssm_states=g["state0"].clone(), cache_indices=ONE,
                        query_start_loc=torch.tensor([0, T], dtype=torch.int32),
                        intermediate_states_buffer=steps, intermediate_state_indices=ZERO,
                        cache_steps=T, retrieve_parent_token=parent)
    return mixed, qkv, o.reshape(T, HV, V), steps[0], window[0], parent


def inputs(dtype, seed):
    torch.manual_seed(seed)
    return {"x": torch.randn(T, DIM).to(dtype), "w": (torch.randn(DIM, WIDTH) * 0.5).to(dtype),
            "conv0": torch.randn(2, DIM, WIDTH - 1).to(dtype),
            "a": torch.randn(T, HV, dtype=bf16), "b": torch.randn(T, HV, dtype=bf16),
            "A_log": torch.randn(HV), "dt_bias": torch.randn(HV),
            "state0": torch.randn(2, HV, V, K) * 0.1}


def compare(g):
    ref = [decode(g, i) for i in range(T)]
    out = {}
    if NEW:  # decode's two conv kernels agree bit for bit: outputs and windows
        fused = [decode(g, i, fused_conv_step) for i in range(T)]
        out["fused_decode_equal"] = [torch.equal(f[0], r[0]) and torch.equal(f[3], r[3])
                                     for f, r in zip(fused, ref)]
    for mode in ("tree", "chain"):
        mixed, qkv, o, states, windows, parent = verify(g, mode == "tree")
        out[mode] = {
            "parent": None if parent is None else parent[0].tolist(),
            "conv_equal": [torch.equal(mixed[i], ref[i][0]) for i in range(T)],
            "conv_ulps": [int((mixed[i] != ref[i][0]).sum()) for i in range(T)],
            "conv_max_diff": max((mixed[i].float() - ref[i][0].float()).abs().max().item()
                                 for i in range(T)),
            # the conv window after candidate i (what commit restores) = decode's conv state
            "window_equal": [torch.equal(windows[i], ref[i][3]) for i in range(T)],
            "out_equal": [torch.equal(o[i], ref[i][1]) for i in range(T)],
            # the fp32 state after candidate i (verify's intermediate state of row i)
            "state_equal": [torch.equal(states[i], ref[i][2]) for i in range(T)],
            # the recurrent kernels alone: decode fed the verify's own conv rows
            "recurrent_equal": [
                all(map(torch.equal, (o[i], states[i]), recurrent_decode(qkv, g, i)))
                for i in range(T)
            ],
        }
    return out


def stock_and_patched(g):
    # SGLang's conv kernel (the rest of the GDN patch on), then the patched one
    CONV_FIX.remove()
    stock = compare(g)
    CONV_FIX.apply()
    return {"stock": stock, "patched": compare(g), "channels": DIM}


def order_sensitive(n):
    # bf16 channels (conv state c0..c2, input x, weights w0..w3) where decode's accumulation
    # order (c0*w0 + c1*w1 + c2*w2 + x*w3) and the tree branch's (x*w3 + c2*w2 + c1*w1 +
    # c0*w0) round to different bf16 after SiLU: found in a torch model of the kernel's
    # arithmetic, c0 and c1 small so the fp32 sum is inexact.
    torch.manual_seed(1)
    m = 1 << 20
    c = torch.randn(m, WIDTH - 1)
    c[:, :2] *= 2.0**-12
    c, x, w = c.to(bf16), torch.randn(m).to(bf16), (torch.randn(m, WIDTH) * 0.5).to(bf16)
    p = [(c[:, j] * w[:, j]).float() for j in range(WIDTH - 1)] + [(x * w[:, -1]).float()]
    silu = lambda s: (s / (1 + torch.exp(-s))).to(bf16)
    hit = silu(((p[0] + p[1]) + p[2]) + p[3]) != silu(((p[3] + p[2]) + p[1]) + p[0])
    idx = hit.nonzero()[:n, 0]
    return c[idx], x[idx], w[idx]


result = {"links": [next_token[0].tolist(), next_sibling[0].tolist()],
          "bf16": stock_and_patched(inputs(bf16, 0)),
          "fp32": stock_and_patched(inputs(torch.float32, 0))}
g = inputs(bf16, 0)
c, x0, w = order_sensitive(8)
n = len(x0)
g["conv0"][1, -n:], g["x"][0, -n:], g["w"][-n:] = c, x0, w  # v channels of the root row
result["bf16_order_sensitive"] = dict(stock_and_patched(g), sensitive=n)
gdn.PATCH.remove()
print("TREE " + json.dumps(result))
"""


SM90_SCRIPT = r"""
import hashlib
import json

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32",
         torch.int64: "*i64"}
compiled = {}


def offline_run(self, *args, grid, warmup, **kwargs):
    # compile for sm_90 instead of launching (as tests/kernels/compile_kernels_sm90.py); a None
    # argument is a constexpr None, as Triton specialises it
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "launch_pdl") if k in kwargs}
    bound = dict(zip(self.arg_names[: len(args)], args, strict=True)) | kwargs
    signature, constexprs = {}, {}
    for p in self.params:
        value = bound.get(p.name, p.default)
        if p.is_constexpr or value is None:
            signature[p.name], constexprs[p.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[p.name] = TYPES[value.dtype]
        else:
            signature[p.name] = "i32"
    try:
        kernel = triton.compile(ASTSource(self, signature, constexprs),
                                target=GPUTarget("cuda", 90, 32), options=options)
        assert kernel.asm["cubin"]
        # the code, without line info and debug sections (they name the source file and line)
        code = "\n".join(ln for ln in kernel.asm["ptx"].split(".section")[0].splitlines()
                         if not ln.lstrip().startswith((".loc", ".file")))
        compiled[self.fn.__name__] = hashlib.sha256(code.encode()).hexdigest()
    except Exception as e:
        compiled[self.fn.__name__] = f"FAILED {type(e).__name__}: {str(e)[-500:]}"


JITFunction.run = offline_run
from sglang.kernels.ops.mamba import causal_conv1d_triton as conv
from specdash.runs.sglang.patches import gdn_verify_as_decode as gdn

T, DIM, W = 4, 64, 4


def launch():
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        x, w = torch.randn(1, DIM, T).to(dtype), torch.randn(DIM, W).to(dtype)
        state = torch.randn(2, DIM, W - 1).to(dtype)
        one, zero = torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
        nxt = torch.tensor([[1, 3, -1, -1]], dtype=torch.int64)
        sib = torch.tensor([[-1, 2, -1, -1]], dtype=torch.int64)
        for mode in ("tree", "chain", "decode"):
            compiled.clear()
            if mode == "decode":
                conv.causal_conv1d_update(x[:, :, 0], state, w, None, "silu",
                                          conv_state_indices=one)
            else:
                tree = mode == "tree"
                conv.causal_conv1d_update(
                    x, state, w, None, "silu", conv_state_indices=one,
                    intermediate_conv_window=torch.zeros(1, T, DIM, W - 1, dtype=dtype),
                    intermediate_state_indices=zero,
                    retrieve_next_token=nxt if tree else None,
                    retrieve_next_sibling=sib if tree else None,
                    retrieve_parent_token=torch.empty_like(nxt) if tree else None)
            out[f"{mode} {dtype}"] = compiled.pop("_causal_conv1d_update_kernel", "not run")
    return out


result = {"stock": launch()}
gdn.PATCH.apply()
result["patched"] = launch()
print("SM90 " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def interpreted(run_each_sglang) -> dict[str, dict]:
    proc = run_each_sglang(GDN_SCRIPT + ROWS_SCRIPT + TREE_SCRIPT, env={"TRITON_INTERPRET": "1"})
    results = {}
    for line in proc.stdout.splitlines():
        tag, _, payload = line.partition(" ")
        if tag in ("GDN", "ROWS", "TREE"):
            results[tag] = json.loads(payload)
    assert set(results) == {"GDN", "ROWS", "TREE"}, proc.stdout[-2000:]
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
    """Both releases, a tree draft: each verify row equals SGLang's decode of its path. The
    chain table (candidate i reads candidates 0..i, what 0.5.23's rows read before) gets the
    tree's branch wrong, so this test fails on it."""
    r = interpreted["ROWS"]
    # request 1 is a tree: its candidate 2 reads the prefix, 0 and 2 (not 1)
    assert r["lengths"] == [6, 7, 8, 10, 11, 11]
    assert r["equal"]
    assert r["chain_rows_equal"] == [True] * 5 + [False]
    assert r["splits"] == [2, 2, 2, 3, 3, 3]  # ceil(len / 4) for lengths 6,7,8,10,11,11
    assert r["max_diff_vs_softmax"] < 1e-5  # and it is attention over the right tokens


TREE_CASES = ("bf16", "fp32", "bf16_order_sensitive")


def test_gdn_tree_verify_with_sglang_conv_differs_from_decode_in_conv_order(interpreted) -> None:
    """NGRAM drafts are trees. GDN verify walks each row's parent only when it is given the
    tree links (retrieve_next_token/sibling; the conv kernel fills retrieve_parent_token for
    the recurrent kernel), which HybridLinearAttnBackend passes only when topk > 1; with the
    links None it treats the packed rows as one chain. Tree: parents [-1, 0, 0, 1]. Here the
    GDN patch is on except its conv kernel: SGLang's own `_causal_conv1d_update_kernel`.

    Recurrent kernel with the parents: each candidate's output equals the patched decode along
    root..candidate, bit for bit. Chain mode on the same tree: candidate 2 (the branch) and 3
    (after it in the rows) see the wrong history. The conv's tree branch sums its taps in the
    reverse of decode's order (x*w3 + parent*w2 + ... vs c0*w0 + ... + x*w3), so its fp32
    accumulator can differ from decode's: with fp32 inputs in about a third of the channels,
    with bf16 inputs (the model's) rarely, since four bf16 products mostly sum exactly in fp32,
    but on order-sensitive channels by one bf16 ulp, which then moves the fp32 GDN state of
    every candidate below (and, when it crosses a bf16 rounding, the output). The windows it
    saves (copies, no arithmetic) are decode's.
    """
    r = interpreted["TREE"]
    assert r["links"] == [[1, 3, -1, -1], [-1, 2, -1, -1]]  # SGLang's links for this tree
    for case in TREE_CASES:
        tree, chain = r[case]["stock"]["tree"], r[case]["stock"]["chain"]
        assert tree["parent"] == [0, 0, 0, 1], case
        assert tree["recurrent_equal"] == tree["window_equal"] == [True] * 4, case
        # chain mode: exact along the chain prefix 0, 1; wrong for the branch and after it
        assert chain["conv_equal"] == chain["out_equal"] == [True, True, False, False], case
        assert chain["recurrent_equal"] == [True, True, False, False], case
        assert chain["state_equal"] == chain["window_equal"] == [True, True, False, False], case
    bf = r["bf16"]["stock"]["tree"]  # random bf16 inputs: no channel here is order-sensitive
    assert bf["conv_equal"] == bf["out_equal"] == bf["state_equal"] == [True] * 4
    fp32 = r["fp32"]["stock"]["tree"]
    assert not any(fp32["conv_equal"]) and 0 < fp32["conv_max_diff"] < 1e-6
    assert all(0 < n < r["fp32"]["channels"] for n in fp32["conv_ulps"]), fp32["conv_ulps"]
    assert not any(fp32["state_equal"])
    sensitive = r["bf16_order_sensitive"]["stock"]["tree"]
    assert r["bf16_order_sensitive"]["sensitive"] > 0
    assert sensitive["conv_equal"] == [False, True, True, True]  # the root row's window
    assert sensitive["conv_ulps"][0] == r["bf16_order_sensitive"]["sensitive"]
    # v channels of the root: every candidate's fp32 state moves (all descend from the root);
    # here the bf16 outputs still round alike
    assert sensitive["state_equal"] == [False] * 4, sensitive


def test_patched_gdn_tree_verify_equals_decode_along_each_path(interpreted) -> None:
    """The whole GDN patch on the same tree: the conv kernel's tree branch adds its taps in
    decode's order, so verify's conv rows and saved windows, and then the recurrent outputs
    and fp32 states of every candidate, equal the patched decode along root..candidate bit
    for bit (fp32, bf16, and the bf16 channels where the order shows). On 0.5.23 decode's conv
    on CUDA is `fused_qkvzba_causal_conv1d_update_contiguous`: equal to the update kernel's
    decode, so to tree verify as well. Chain mode (links None) stays wrong on a tree: the
    patch needs SGLang's tree links, which it passes at topk > 1 (NGRAM's default breadth)."""
    r = interpreted["TREE"]
    for case in TREE_CASES:
        tree, chain = r[case]["patched"]["tree"], r[case]["patched"]["chain"]
        assert tree["parent"] == [0, 0, 0, 1], case
        for key in ("conv_equal", "window_equal", "out_equal", "state_equal", "recurrent_equal"):
            assert tree[key] == [True] * 4, (case, key, tree)
        assert tree["conv_ulps"] == [0] * 4 and tree["conv_max_diff"] == 0.0, case
        assert chain["conv_equal"] == chain["state_equal"] == [True, True, False, False], case
        if interpreted["version"] == "0.5.23":
            for stage in ("stock", "patched"):
                assert r[case][stage]["fused_decode_equal"] == [True] * 4, (case, stage)
        else:
            assert "fused_decode_equal" not in r[case]["patched"]


def test_patched_conv_kernel_compiles_for_sm90_and_leaves_decode_code_alone(
    run_each_sglang,
) -> None:
    """The interpreter runs the patched conv kernel as Python; Triton's GPU compiler is another
    matter. With TRITON_INTERPRET=0, SGLang's `causal_conv1d_update` launches are compiled
    offline for sm_90 (cubin via ptxas), stock and patched, on a tree (the links), a chain
    (verify without links) and one decode token, bf16 and fp32. All compile; the patched
    kernel's PTX (line info and debug sections aside) is SGLang's own for decode
    and chain verify, and differs only on the tree. 0.5.17's decode runs this very kernel."""
    proc = run_each_sglang(SM90_SCRIPT, env={"TRITON_INTERPRET": "0"})
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SM90 "))
    r = json.loads(line[5:])
    for stage in ("stock", "patched"):
        assert len(r[stage]) == 6 and all(len(h) == 64 for h in r[stage].values()), r[stage]
    for key, code in r["patched"].items():
        assert (code == r["stock"][key]) == (not key.startswith("tree")), key
