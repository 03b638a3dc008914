"""CPU exact rows: a verify row equals the decode row at its position, bit for bit.

The CPU GEMM and log_softmax run every exact call in `ops.ROW_SLOTS` row slots (row of
position p in slot p % ROW_SLOTS). These tests check the claim that makes that exact
(slot i's output depends only on slot i's input, for a fixed call shape) directly on
MKL, with random contents in the other slots, and then end to end through the backend:
`backend(x[r:r+1], start=p)` (decode) against row r of a multi-row call (verify) for
wrapping, chunked and unaligned row ranges, on the tiny pair's shapes and on 5120-wide
ones. Every comparison is `torch.equal`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdash import ops

SLOTS = ops.ROW_SLOTS
# (N, K): the shipped tiny pair's projections (qkv 384, GDN in_proj 392, o/out 128,
# gate_up 768, down 128x384, lm_head 2048) and 27B-like widths
TINY_SHAPES = [(384, 128), (392, 128), (128, 128), (768, 128), (128, 384), (2048, 128)]
WIDE_SHAPES = [(5120, 5120), (256, 5120), (5120, 4352), (7, 5120), (3, 33)]


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request: pytest.FixtureRequest):  # noqa: ANN201
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _rows_equal_alone(fn, x: torch.Tensor, start: int) -> list[int]:  # noqa: ANN001
    """Rows of `slotted_rows(fn, x, start)` that differ from the same row run alone."""
    together = ops.slotted_rows(fn, x, start)
    return [
        r
        for r in range(x.shape[0])
        if not torch.equal(together[r], ops.slotted_rows(fn, x[r : r + 1], start + r)[0])
    ]


@pytest.mark.parametrize("n,k", TINY_SHAPES + WIDE_SHAPES)
def test_mkl_slot_output_ignores_other_slots(n: int, k: int, threads: int) -> None:
    gen = torch.Generator().manual_seed(n * 7 + k)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    for slot in range(SLOTS):
        row = torch.randn(k, generator=gen)
        outs = []
        for scale in (1.0, 1e3, 0.0):
            buf = torch.randn(SLOTS, k, generator=gen) * scale
            buf[slot] = row
            outs.append(F.linear(buf, w)[slot])
        assert all(torch.equal(outs[0], o) for o in outs[1:]), f"slot {slot}"


@pytest.mark.parametrize("n,k", TINY_SHAPES + WIDE_SHAPES[:2])
def test_verify_rows_equal_decode_rows_through_the_cpu_backend(n: int, k: int) -> None:
    backend = ops.resolve_gemm_backend("auto", torch.device("cpu"))
    assert backend.row_slots
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    # (start, rows): aligned, unaligned, wrapping past slot 0, and more rows than slots
    for start, t in [(0, 5), (3, 5), (6, 5), (7, 2), (13, 8), (5, 17), (41, 10)]:
        x = torch.randn(t, k, generator=gen)
        verify = backend(x, w, exact=True, start=start)
        for r in range(t):
            decode = backend(x[r : r + 1], w, exact=True, start=start + r)
            assert torch.equal(verify[r : r + 1], decode), f"start {start}, row {r}"


@pytest.mark.parametrize("v", [2048, 2047, 151936])
def test_log_softmax_rows_equal_decode_rows(v: int, threads: int) -> None:
    gen = torch.Generator().manual_seed(v)
    for start, t in [(0, 5), (6, 5), (3, 17)]:
        logits = torch.randn(t, v, generator=gen) * 4
        together = ops.log_softmax(logits, exact=True, start=start)
        for r in range(t):
            alone = ops.log_softmax(logits[r : r + 1], exact=True, start=start + r)
            assert torch.equal(together[r : r + 1], alone), f"start {start}, row {r}"


def test_slot_check_catches_a_row_op_that_mixes_slots() -> None:
    """The comparison above can fail: an op whose row reads another slot is caught."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=gen)
    w = torch.randn(32, 64, generator=gen)
    assert _rows_equal_alone(lambda b: F.linear(b, w), x, 3) == []
    leaky = lambda b: F.linear(b, w) + 1e-3 * b.sum()  # noqa: E731
    assert _rows_equal_alone(leaky, x, 3) == [0, 1, 2, 3, 4]


def test_slotted_rows_places_and_returns_rows_in_order() -> None:
    """Slot placement: row r of a call from `start` lands in slot (start + r) % SLOTS."""
    seen: list[torch.Tensor] = []

    def record(buf: torch.Tensor) -> torch.Tensor:
        seen.append(buf.clone())
        return buf * 2

    x = torch.arange(1, 11, dtype=torch.float32)[:, None]  # rows 1..10, more than SLOTS
    out = ops.slotted_rows(record, x, start=6)
    assert torch.equal(out, x * 2)
    assert [b.shape[0] for b in seen] == [SLOTS, SLOTS]
    assert seen[0][6:, 0].tolist() == [1, 2] and seen[0][:6, 0].tolist() == [3, 4, 5, 6, 7, 8]
    assert seen[1][6:, 0].tolist() == [9, 10] and not seen[1][:6].any()


def test_row_slot_backend_refuses_a_call_without_position() -> None:
    backend = ops.resolve_gemm_backend("auto", torch.device("cpu"))
    with pytest.raises(ValueError, match="position"):
        backend(torch.ones(2, 4), torch.ones(3, 4), exact=True)
