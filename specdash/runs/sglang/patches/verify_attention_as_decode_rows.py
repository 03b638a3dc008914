"""Verify attention as decode rows: TARGET_VERIFY full attention runs the decode kernel.

Why: SGLang verifies the k+1 candidate tokens with its extend/prefill attention kernel
(`extend_attention_fwd` + custom mask for Triton, `max_seqlen_q=n` for FA3), whose reduction
order differs from the decode kernel plain greedy decoding uses, so logits can differ in the
last bits. Here verify expands the batch to bs*n decode rows, row (b, i) attending to the
prefix and candidate i's path (the candidates' KV is written first), and runs the same decode
kernel with the same per-length split (deterministic mode's fixed split tile for Triton,
`decode_num_splits` for FA3): the row sees exactly what a plain decode of that token sees.
Triton rows follow the verify tree mask in both releases (NGRAM drafts are trees); 0.5.23's
FA3 rows take chains only (candidates 0..i) and refuse an engine that verifies trees.

Replaces `HybridLinearAttnBackend.forward_extend`; other modes and the linear-attention layers
go to the original. Per release:
- 0.5.17, Triton: the rows' KV table is built from `req_to_token` by SGLang's own
  `create_flashinfer_kv_indices_triton`, exactly as its decode builds it, plus each candidate's
  ancestors from the verify tree mask (NGRAM drafts are trees), with static shapes, so the
  verify forward can be captured in a CUDA graph. No FA3 (0.5.17 lacks
  `get_paged_mha_kv_cache`).
- 0.5.23, Triton: the table is built from the verify metadata's prefix slots and the
  candidates' ancestors from the same tree mask, with a host sync (eager only); FA3 rows are
  graph-capturable, chains only (`seq_lens[b] + i + 1` keys; topk > 1 is refused).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdash.runs.sglang.patches.registry import Patch, Rebinding, Target, Variant

_HYBRID = "sglang.srt.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend"
_FA3 = "sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend"


def row_lengths(seq_lens: Any, n: int) -> Any:
    """Cached length seen by each decode row: (seq_lens[:, None] + [1..n]).flatten()."""
    import torch

    steps = torch.arange(1, n + 1, device=seq_lens.device, dtype=seq_lens.dtype)
    return (seq_lens[:, None] + steps).reshape(-1)


def row_kv_indices(
    prefix_indptr: Any, prefix_indices: Any, candidate_locs: Any, seq_lens: Any, ancestors: Any
) -> tuple[Any, Any]:
    """CSR (indptr, indices) of the bs*n decode rows: row (b, i) reads request b's prefix
    slots (the verify metadata's own, already in the kernel's id space) and then the KV slots
    of candidate i's ancestors and itself (`ancestors[b, i]`, see `verify_ancestors`) in tree
    order, exactly the slots a plain decode of that path reads."""
    import torch

    bs, n, _ = ancestors.shape
    lens = (seq_lens[:, None] + ancestors.sum(-1)).reshape(-1)
    rows = lens.shape[0]
    device = prefix_indices.device
    indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
    indptr[1:] = torch.cumsum(lens, 0)
    width = int(lens.max())
    pos = torch.arange(width, device=device)[None, :]
    req = torch.arange(rows, device=device) // n
    prefix_len = seq_lens.repeat_interleave(n)[:, None]
    in_prefix = pos < prefix_len
    prefix_at = (prefix_indptr[:-1].repeat_interleave(n)[:, None] + pos).clamp(
        max=max(prefix_indices.numel() - 1, 0)
    )
    # row (b, i)'s r-th path candidate: the ancestors sort first, in candidate order
    steps = torch.arange(n, device=device)
    order = torch.where(ancestors, steps, n + steps).reshape(rows, n).argsort(-1)
    path_at = order.gather(1, (pos - prefix_len).clamp(0, n - 1).expand(rows, width))
    slots = torch.where(
        in_prefix,
        prefix_indices[prefix_at],
        candidate_locs.to(prefix_indices.dtype)[req[:, None] * n + path_at],
    )
    return indptr, slots[pos < lens[:, None]]


def _save_kv_triton(backend: Any, layer: Any, forward_batch: Any, k: Any, v: Any) -> None:
    """As `TritonAttnBackend.forward_extend` saves the candidates' KV (SGLang 0.5.23)."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    loc = KVWriteLoc.for_batch(forward_batch, swa_loc=backend.forward_metadata.swa_out_cache_loc)
    if layer.k_scale is None:
        backend._set_kv_buffer(forward_batch, layer, loc, k, v)
    else:
        backend._set_kv_buffer(
            forward_batch, layer, loc, k.clone(), v.clone(), layer.k_scale, layer.v_scale
        )


def _save_kv_triton_0_5_17(backend: Any, layer: Any, forward_batch: Any, k: Any, v: Any) -> None:
    """As `TritonAttnBackend.forward_decode` saves KV in SGLang 0.5.17."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    meta = backend.forward_metadata
    loc = KVWriteLoc(
        forward_batch.out_cache_loc,
        meta.swa_out_cache_loc,
        full_loc=meta.out_cache_loc_full_physical,
    )
    backend._set_kv_buffer(forward_batch, layer, loc, k, v, layer.k_scale, layer.v_scale)


def _save_kv_fa3(backend: Any, layer: Any, forward_batch: Any, k: Any, v: Any) -> None:
    """As `FlashAttentionBackend.forward_extend` saves KV for bf16 caches (SGLang 0.5.23)."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    loc = KVWriteLoc.for_layer(
        forward_batch, layer, swa_loc=backend.forward_metadata.swa_out_cache_loc
    )
    backend.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, layer.k_scale, layer.v_scale)


def _require_fixed_split(backend: Any) -> None:
    if backend.split_tile_size is None:
        raise RuntimeError(
            "verify_attention_as_decode_rows needs a fixed Triton split tile "
            "(enable_deterministic_inference)"
        )
    if backend.page_size != 1:
        raise RuntimeError("verify_attention_as_decode_rows (Triton) supports page_size 1 only")


def verify_ancestors(backend: Any, seq_lens: Any, n: int) -> Any:
    """[bs, n, n] bool: candidate j is candidate i or one of its ancestors. From the verify
    tree mask in SGLang's full layout (request b: an [n, seq_lens[b] + n] block at
    mask_indptr[b]); a chain (j <= i) when the batch carries no mask. NGRAM drafts are trees
    even at BFS breadth 1: every trie anchor starts at the root, so a second anchor adds
    siblings (NGRAM at k=5 drafts such trees on the SGLang test pair)."""
    import torch

    meta = backend.forward_metadata
    steps = torch.arange(n, device=seq_lens.device)
    mask = getattr(meta, "custom_mask", None)
    if mask is None:
        return (steps[:, None] >= steps[None, :]).expand(seq_lens.shape[0], n, n)
    bs = seq_lens.shape[0]
    seq = seq_lens.long()[:, None, None]
    at = (
        meta.mask_indptr[:bs].long()[:, None, None]
        + steps[None, :, None] * (seq + n)
        + seq
        + steps[None, None, :]
    )
    return mask[at].bool()


def decode_row_table(backend: Any, forward_batch: Any, n: int) -> tuple[Any, Any, Any]:
    """(kv_indptr, kv_indices, num_kv_splits) of the bs*n decode rows, built the way SGLang
    0.5.17's decode builds its own: row (b, i) reads request b's `req_to_token` prefix
    (seq_lens[b] slots, by SGLang's `create_flashinfer_kv_indices_triton`), then the KV slots
    of candidate i's ancestors and itself in tree order: exactly what a plain decode of that
    path reads. Every shape is static (the index buffer has room for rows * max_context_len,
    plus one slot that takes the non-ancestors), so this runs inside a CUDA graph capture.
    Built per layer call, never cached on the ForwardBatch: SGLang runs a captured batch
    eagerly before capturing it, and a table cached then would be frozen into the graph as a
    constant (every graphed verify would read the warm-up's table and be wrong)."""
    import torch
    from sglang.kernels.ops.kvcache.kv_indices import create_flashinfer_kv_indices_triton

    bs = forward_batch.batch_size
    seq_lens = forward_batch.seq_lens[:bs]
    ancestors = verify_ancestors(backend, seq_lens, n)
    lens = (seq_lens[:, None] + ancestors.sum(-1)).reshape(-1)
    rows = lens.shape[0]
    device = lens.device
    indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
    indptr[1:] = torch.cumsum(lens, 0)
    dump = rows * backend.max_context_len
    indices = torch.empty(dump + 1, dtype=torch.int64, device=device)
    req_to_token = backend.req_to_token
    create_flashinfer_kv_indices_triton[(rows,)](
        req_to_token,
        forward_batch.req_pool_indices[:bs].repeat_interleave(n),
        seq_lens.repeat_interleave(n),
        indptr,
        None,
        indices,
        req_to_token.stride(0),
    )
    rank = ancestors.long().cumsum(-1) - 1
    at = indptr[:-1].view(bs, n, 1).long() + seq_lens.view(bs, 1, 1).long() + rank
    slots = forward_batch.out_cache_loc[: bs * n].view(bs, 1, n).expand(bs, n, n)
    indices.scatter_(0, torch.where(ancestors, at, dump).reshape(-1), slots.reshape(-1).long())
    tile = backend.split_tile_size
    splits = ((lens + tile - 1) // tile).to(torch.int32)
    return indptr, indices, splits


def triton_rows_0_5_17(
    backend: Any, q: Any, layer: Any, forward_batch: Any, sinks: Any = None
) -> Any:
    """TritonAttnBackend (0.5.17): `decode_attention_fwd` over bs*n rows, called as
    `forward_decode` calls it, on `decode_row_table`."""
    _require_fixed_split(backend)
    if backend._translate_kv_loc is not None:
        raise RuntimeError("verify_attention_as_decode_rows: unified KV pools are not supported")
    n = q.shape[0] // forward_batch.batch_size
    table = decode_row_table(backend, forward_batch, n)
    return _decode_rows(
        backend, q, layer, *table, sinks=sinks, has_mla=False, use_pdl=backend.use_pdl
    )


def triton_rows(backend: Any, q: Any, layer: Any, forward_batch: Any, sinks: Any = None) -> Any:
    """TritonAttnBackend (0.5.23): `decode_attention_fwd` over bs*n rows with a fixed split
    tile, the row table built from the verify metadata's prefix and each candidate's
    ancestors from its tree mask (a host sync: eager only)."""
    import torch

    _require_fixed_split(backend)
    bs = forward_batch.batch_size
    n = q.shape[0] // bs
    meta = backend.forward_metadata
    seq_lens = forward_batch.seq_lens[:bs]
    kv_indptr, kv_indices = row_kv_indices(
        meta.kv_indptr[: bs + 1],
        meta.kv_indices,
        forward_batch.out_cache_loc,
        seq_lens,
        verify_ancestors(backend, seq_lens, n),
    )
    tile = backend.split_tile_size
    splits = ((kv_indptr[1:] - kv_indptr[:-1] + tile - 1) // tile).to(torch.int32)
    return _decode_rows(backend, q, layer, kv_indptr, kv_indices, splits, sinks=sinks)


def _decode_rows(
    backend: Any,
    q: Any,
    layer: Any,
    kv_indptr: Any,
    kv_indices: Any,
    num_kv_splits: Any,
    *,
    sinks: Any,
    **release_kwargs: Any,
) -> Any:
    """SGLang's Triton `decode_attention_fwd` over q's rows, one decode request per row, with
    the arguments `TritonAttnBackend.forward_decode` passes (plus the release's own)."""
    import torch

    rows = q.shape[0]
    heads, dq, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
    max_splits = backend.max_kv_splits
    attn_logits = torch.empty(rows, heads, max_splits, dv, dtype=torch.float32, device=q.device)
    attn_lse = torch.empty(rows, heads, max_splits, dtype=torch.float32, device=q.device)
    o = q.new_empty(rows, heads * dv)
    scaled = layer.k_scale is not None and layer.v_scale is not None
    backend.decode_attention_fwd(
        q.reshape(rows, heads, dq),
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        o.view(rows, heads, dv),
        kv_indptr,
        kv_indices,
        attn_logits,
        attn_lse,
        num_kv_splits,
        max_splits,
        layer.scaling,
        layer.k_scale_float if scaled else 1.0,
        layer.v_scale_float if scaled else 1.0,
        logit_cap=_logit_cap(layer),
        sinks=sinks,
        xai_temperature_len=layer.xai_temperature_len,
        page_size=1,
        **release_kwargs,
    )
    return o


def _logit_cap(layer: Any) -> float:
    from sglang.srt.layers.attention.triton_backend import logit_capping_mod

    return logit_capping_mod(layer.logit_capping_method, layer.logit_cap)


def fa3_rows(backend: Any, q: Any, layer: Any, forward_batch: Any, sinks: Any = None) -> Any:
    """FlashAttentionBackend: `flash_attn_with_kvcache` with max_seqlen_q=1 per row.

    Rows follow chains only (candidate i reads candidates 0..i), so an engine that verifies
    trees (topk > 1: NGRAM at its default breadth) is refused rather than given wrong rows.
    Never run in CI: flashattention_backend imports sgl_kernel at module level, which does not
    load without CUDA (`patches check` still hashes its targets, from the source files)."""
    if getattr(backend, "topk", 0) > 1:
        raise RuntimeError(
            "verify_attention_as_decode_rows: FA3 rows follow chains only and this engine "
            f"verifies draft trees (topk {backend.topk}); use attention_backend=triton"
        )
    import torch
    from sglang.srt.layers.attention.flashattention_backend import flash_attn_with_kvcache

    bs = forward_batch.batch_size
    n = q.shape[0] // bs
    heads, dq, dv = layer.tp_q_head_num, layer.head_dim, layer.v_head_dim
    metadata = backend.forward_metadata
    key_cache, value_cache = backend.get_paged_mha_kv_cache(layer)
    out = flash_attn_with_kvcache(
        q=q.reshape(bs * n, 1, heads, dq).contiguous(),
        k_cache=key_cache,
        v_cache=value_cache,
        page_table=metadata.page_table.repeat_interleave(n, 0),
        cache_seqlens=row_lengths(forward_batch.seq_lens, n).to(torch.int32),
        max_seqlen_q=1,
        softmax_scale=layer.scaling,
        causal=True,
        softcap=layer.logit_cap,
        num_splits=backend.decode_num_splits,
        scheduler_metadata=None,
        ver=backend.fa_impl_ver,
    )
    return out.reshape(bs * n, heads * dv)


RowKernels = dict[str, tuple[Callable[..., Any], Callable[..., None]]]
"""Full-attention backend class name -> (decode rows, how that backend saves the verify KV)."""

ROW_KERNELS: dict[str, RowKernels] = {
    "0.5.17": {"TritonAttnBackend": (triton_rows_0_5_17, _save_kv_triton_0_5_17)},
    "0.5.23": {
        "TritonAttnBackend": (triton_rows, _save_kv_triton),
        "FlashAttentionBackend": (fa3_rows, _save_kv_fa3),
    },
}


def verify_as_decode_rows(
    row_kernels: RowKernels,
    hybrid: Any,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool,
    q: Any,
    k: Any,
    v: Any,
    **kwargs: Any,
) -> Any:
    """The TARGET_VERIFY full-attention branch (also what diffs/ puts into SGLang's source)."""
    backend = hybrid.full_attn_backend
    paths = row_kernels.get(type(backend).__name__)
    if paths is None:
        raise RuntimeError(
            f"verify_attention_as_decode_rows: no decode-row path for "
            f"{type(backend).__name__} here; use attention_backend="
            + " or ".join(sorted(row_kernels))
        )
    rows, save_kv = paths
    if save_kv_cache and k is not None:
        save_kv(backend, layer, forward_batch, k, v)
    return rows(backend, q, layer, forward_batch, sinks=kwargs.get("sinks"))


def _as_decode_rows(row: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda original: _decode_rows_forward_extend(original, ROW_KERNELS[row])


def _decode_rows_forward_extend(
    original: Callable[..., Any], row_kernels: RowKernels
) -> Callable[..., Any]:
    def forward_extend(
        self,
        layer,
        forward_batch,
        save_kv_cache=True,
        q=None,
        k=None,
        v=None,
        mixed_qkv=None,
        a=None,
        b=None,
        **kwargs,
    ):
        if forward_batch.forward_mode.is_target_verify() and self._is_full_attn(
            layer, kwargs.get("layer_id")
        ):
            return verify_as_decode_rows(
                row_kernels, self, layer, forward_batch, save_kv_cache, q, k, v, **kwargs
            )
        return original(
            self, layer, forward_batch, save_kv_cache, q, k, v, mixed_qkv, a, b, **kwargs
        )

    forward_extend.__specdash_original__ = original  # type: ignore[attr-defined]
    return forward_extend


_TRITON = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"

_HYBRID_TARGETS = (  # the same source in 0.5.17 and 0.5.23
    Target(
        f"{_HYBRID}.forward_extend",
        "7feebbdc1924eddec77dd8397228e9dcce06db94558e38a53ea8ba8aef31d728",
    ),
    Target(
        f"{_HYBRID}._is_full_attn",
        "fa0f3067149d81c47bfd5f3d45750de60793bb12ac5fc75612e1685ebb6bb628",
        role="relied on",
    ),
)

PATCH = Patch(
    name="verify_attention_as_decode_rows",
    flag="attention",
    summary="TARGET_VERIFY full attention through the decode kernel, one row per candidate",
    variants={
        "0.5.17": Variant(
            targets=(
                *_HYBRID_TARGETS,
                Target(
                    f"{_TRITON}.forward_decode",
                    "7d358d0c723bac03f1b95f3db50201bb2277d80ff5158e7a56d151542e71febb",
                    role="relied on",
                ),
                Target(
                    f"{_TRITON}.forward_extend",
                    "5e4ab06c1a98c45223d448f135a2756bc47b72e48471a9feb57388a9b52cb0e2",
                    role="relied on",
                ),
                Target(
                    f"{_TRITON}._set_kv_buffer",
                    "f38832844a1952cfcc533f9324fb2417d1568fea1a521b51ce7c2252c65651bd",
                    role="relied on",
                ),
                Target(
                    f"{_TRITON}.get_num_kv_splits",
                    "c28179d8c2356b9719745e87fa1ab58b258e414da6729cf00ebd664cbf84e010",
                    role="relied on",
                ),
                Target(
                    f"{_TRITON}._fill_kv_indptr_and_indices",
                    "e7a0fcd1c3299a87cfab6896ef7f2087886c08e067208204e33c3608d49d537c",
                    role="relied on",
                ),
                Target(
                    "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd",
                    "d02eb025dc3d041e6eff3f2f9965c9cdfe6087fcb69efa4335ee876ea004c737",
                    role="relied on",
                ),
                Target(
                    "sglang.kernels.ops.kvcache.kv_indices.create_flashinfer_kv_indices_triton",
                    "4fe3e8074774bda14c6fdc5c05a24911e1ed41d688ab9be872adc0fc1a779af7",
                    role="relied on",
                ),
            ),
            rebindings=(Rebinding(_HYBRID, "forward_extend", _as_decode_rows("0.5.17")),),
        ),
        "0.5.23": Variant(
            targets=(
                *_HYBRID_TARGETS,
                Target(
                    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode",
                    "7577d9e3055af8a4aebeaeb1ede2a66742e830cb11630936a7647ccd2b61e69f",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend",
                    "3dfe4c158fa799b1bacd290eca44c283175e161a95f35222c5858d3d7108756b",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend._set_kv_buffer",
                    "5b11c98941c9b742b5ff65e65ddcd5370933395bec971a4ebeed988fba0bd892",
                    role="relied on",
                ),
                Target(
                    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.get_num_kv_splits",
                    "f2a2daa2fedaa129ab55f793dfbac41773f5b840a1f13a6e26fd95b9377e387d",
                    role="relied on",
                ),
                Target(
                    f"{_FA3}.forward_decode",
                    "8a467a1a32f93feedcb798ac4f85f642b9d32c82b4aab312aefc092f58f5b74c",
                    role="relied on",
                ),
                Target(
                    f"{_FA3}.forward_extend",
                    "626b79d522ad1e1acbe6bf3c274e78fd548c4a9b4f02aa4fe893a3033fe74d69",
                    role="relied on",
                ),
                Target(
                    f"{_FA3}.get_paged_mha_kv_cache",
                    "98aa973d321fed93bd923b25061f98bfd1834a431bb61692cfaf08f87838ba8d",
                    role="relied on",
                ),
                Target(
                    "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd",
                    "618af192d7dfd748399048fb8e63b06b1526e92c1b52add09b3930c67447bf46",
                    role="relied on",
                ),
            ),
            rebindings=(Rebinding(_HYBRID, "forward_extend", _as_decode_rows("0.5.23")),),
        ),
    },
)
