"""CPU exact rows: each verify row equals the decode row at its position, bit for bit.

The CPU exact path batches only what is elementwise (`fixed_order_sum` included) and runs
GEMM, attention and the GDN recurrence once per row / token with decode's shapes. These
tests check each of those pieces directly with `torch.equal` (the whole-model check is
tests/engine/test_engine_exact.py), including the cheaper implementations that replaced the
original ones: they must give the original's bits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdash.engine import ops
from specdash.kernels import gemm_backends


def _pairwise_by_slicing(x: torch.Tensor) -> torch.Tensor:
    """The reference tree: halve with `x[..., :w] + x[..., w:]` until one column is left."""
    width = 1 << max(x.shape[-1] - 1, 0).bit_length()
    x = F.pad(x, (0, width - x.shape[-1]))
    while width > 1:
        width //= 2
        x = x[..., :width] + x[..., width:]
    return x


SPECIAL = torch.tensor([0.0, 1e-45, 1e-38, 2.0**-24, 1.0, 1e10, 3.4e38, float("inf")])


@pytest.mark.parametrize("width", [1, 2, 3, 32, 100, 128, 256, 5120])
def test_fixed_order_sum_is_the_pairwise_tree_for_every_row(width: int) -> None:
    gen = torch.Generator().manual_seed(width)
    for lead in [(), (1,), (5,), (5, 4)]:
        for scale in (1e-12, 1.0, 1e12):
            x = torch.randn(*lead, width, generator=gen) ** 2 * scale
            pick = torch.rand(x.shape, generator=gen) < 0.2
            x = torch.where(pick, SPECIAL[torch.randint(0, 8, x.shape, generator=gen)], x)
            got = ops.fixed_order_sum(x)
            assert torch.equal(got, _pairwise_by_slicing(x)), (lead, scale)
            rows, sums = x.reshape(-1, width), got.reshape(-1, 1)
            for r in range(rows.shape[0]):  # a row alone (decode) gets the same bits
                assert torch.equal(ops.fixed_order_sum(rows[r : r + 1]), sums[r : r + 1])


def test_fixed_order_sum_differs_from_a_plain_sum() -> None:
    """The order is the point: torch's own sum of the same values gives other bits."""
    x = torch.randn(64, 5120, generator=torch.Generator().manual_seed(0)) ** 2
    assert not torch.equal(ops.fixed_order_sum(x), x.sum(-1, keepdim=True))


@pytest.mark.parametrize("t", [1, 2, 5, 17])
@pytest.mark.parametrize("hv,dk,dv", [(4, 32, 32), (48, 128, 128), (3, 5, 7)])
def test_gdn_verify_steps_are_decode_steps(t: int, hv: int, dk: int, dv: int) -> None:
    gen = torch.Generator().manual_seed(t * hv + dk)
    q = F.normalize(torch.randn(t, hv, dk, generator=gen), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(t, hv, dk, generator=gen), dim=-1)
    v = torch.randn(t, hv, dv, generator=gen)
    decay, beta = torch.rand(t, hv, generator=gen), torch.rand(t, hv, generator=gen)
    state = torch.randn(hv, dk, dv, generator=gen)
    o, steps = ops.gdn_recurrent_steps(q, k, v, decay, beta, state)
    h = state
    for i in range(t):
        o1, s1 = ops.gdn_recurrent_steps(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], decay[i : i + 1], beta[i : i + 1], h
        )
        assert torch.equal(o[i], o1[0]) and torch.equal(steps[i], s1[0]), f"token {i}"
        h = s1[0]


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 32), (24, 4, 256), (3, 3, 8), (3, 1, 11)])
def test_attention_verify_rows_are_decode_rows(hq: int, hkv: int, d: int) -> None:
    gen = torch.Generator().manual_seed(hq * d)
    cap = 300
    k_cache, v_cache = torch.randn(2, hkv, cap, d, generator=gen).unbind(0)
    for start, t in [(0, 5), (7, 17), (cap - 6, 5)]:
        q = torch.randn(t, hq, d, generator=gen)
        rows = ops.attention_decode_rows(q, k_cache, v_cache, start, d**-0.5)
        for r in range(t):
            alone = ops.attention_decode_rows(q[r : r + 1], k_cache, v_cache, start + r, d**-0.5)
            assert torch.equal(rows[r : r + 1], alone), f"start {start}, row {r}"


@pytest.mark.parametrize("n,k", [(2048, 128), (392, 128), (128, 384), (256, 5120), (7, 33)])
def test_cpu_gemm_verify_rows_are_decode_rows(n: int, k: int) -> None:
    """Including odd K, where a verify row starts at an unaligned address."""
    backend = gemm_backends.resolve("auto", torch.device("cpu"))
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    x = torch.randn(9, k, generator=gen)
    verify = backend(x, w, exact=True)
    for r in range(x.shape[0]):
        decode = backend(x[r : r + 1].clone(), w, exact=True)  # a fresh, aligned row
        assert torch.equal(verify[r : r + 1], decode), f"row {r}"
        assert torch.equal(backend(x[r : r + 1], w, exact=True), decode), f"row {r} as a view"


# every weight shape of the embedded pair, a wide K, odd N/K
EXACT_SHAPES = [(2048, 128), (768, 128), (392, 128), (384, 128), (128, 384), (128, 128)]


@pytest.mark.parametrize("n,k", [*EXACT_SHAPES, (256, 5120), (7, 33)])
def test_cpu_exact_gemm_rows_do_not_depend_on_slot_or_m(n: int, k: int) -> None:
    """The exact CPU GEMM is batch-invariant: a row's bits are those of the row alone (decode),
    whatever its position in the call, the number of rows (1..17) and the other
    rows' values; the test `test_cpu_isa` re-runs under a second vector ISA."""
    backend = gemm_backends.resolve("auto", torch.device("cpu"))
    assert backend.batch_invariant
    gen = torch.Generator().manual_seed(7 * n + k)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    x = torch.randn(17, k, generator=gen)
    alone = [backend(x[r : r + 1].clone(), w, exact=True) for r in range(x.shape[0])]
    for m in range(1, x.shape[0] + 1):
        for start in (0, x.shape[0] - m):
            rows = x[start : start + m]
            out = backend(rows, w, exact=True)
            for r in range(m):
                assert torch.equal(out[r : r + 1], alone[start + r]), f"m {m}, row {start + r}"
    # other rows' values do not matter, nor does the slot (each row of x in every slot of a
    # block of random neighbours)
    m = 8
    for r in range(0, x.shape[0], 3):
        for slot in range(m):
            block = torch.randn(m, k, generator=gen)
            block[slot] = x[r]
            got = backend(block, w, exact=True)[slot : slot + 1]
            assert torch.equal(got, alone[r]), f"row {r} in slot {slot}"


def test_cpu_gemm_follows_in_place_weight_updates() -> None:
    """The backend's cached [K, N] copy of a weight is remade when the weight changes."""
    backend = gemm_backends.resolve("auto", torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(64, 32, generator=gen), torch.randn(3, 32, generator=gen)
    before = backend(x, w, exact=False)
    assert torch.equal(before, x @ w.t().contiguous())
    exact_before = backend(x, w, exact=True)
    w.mul_(2)
    after = backend(x, w, exact=False)
    assert torch.equal(after, x @ w.t().contiguous()) and not torch.equal(after, before)
    assert not torch.equal(backend(x, w, exact=True), exact_before)
