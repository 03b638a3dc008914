"""Verify-as-decode-rows on SGLang 0.5.23's real Triton decode kernel (TRITON_INTERPRET=1):
the bs*n verify rows equal, bit for bit, a plain decode batch in which each row is its own
sequence of length seq_len + i + 1, with the split counts SGLang's own
`TritonAttnBackend.get_num_kv_splits` picks in deterministic mode."""

from __future__ import annotations

import json

ROWS_SCRIPT = """
import json
from types import SimpleNamespace
import torch

from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from specdash.engine_patches.verify_attention_as_decode_rows import triton_rows

torch.manual_seed(0)
H, HKV, D, TILE, MAX_CTX, SLOTS = 2, 1, 16, 4, 32, 64
k_buf, v_buf = torch.randn(SLOTS, HKV, D), torch.randn(SLOTS, HKV, D)
req_to_token = torch.randperm(SLOTS)[: 2 * MAX_CTX].reshape(2, MAX_CTX).to(torch.int32)
backend = SimpleNamespace(
    split_tile_size=TILE, page_size=1, max_kv_splits=MAX_CTX // TILE,
    enable_deterministic=True, static_kv_splits=False, device_core_count=132,
    req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
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
verify = triton_rows(backend, q, layer,
                     SimpleNamespace(batch_size=bs, seq_lens=seq_lens, req_pool_indices=pools))

# Plain decode: every row its own request, the way TritonAttnBackend.forward_decode runs it.
lengths = [int(seq_lens[b]) + i + 1 for b in range(bs) for i in range(n)]
indices = [req_to_token[pools[b], : int(seq_lens[b]) + i + 1] for b in range(bs) for i in range(n)]
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
print("RESULT " + json.dumps({
    "equal": torch.equal(verify, decode),
    "splits": splits.tolist(),
    "max_diff_vs_softmax": (verify - softmax).abs().max().item(),
}))
"""


def test_verify_rows_equal_sglang_decode_bitwise(run_sglang) -> None:
    proc = run_sglang(ROWS_SCRIPT, env={"TRITON_INTERPRET": "1"})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["equal"]
    assert r["splits"] == [2, 2, 2, 3, 3, 3]  # ceil(len / 4) for lengths 6,7,8,10,11,12
    assert r["max_diff_vs_softmax"] < 1e-5  # and it is attention over the right tokens
