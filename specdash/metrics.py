"""The numbers every view shows, each defined once: the dashboard, the headless summary, the
audit, the report and the CSV export all compute them here (docs: the dashboard glossary)."""

from __future__ import annotations

import struct


def acceptance_rate(accepted: int, proposed: int) -> float | None:
    """Accepted drafts / drafts actually proposed (an n-gram drafter often proposes fewer than
    k); None when nothing was proposed."""
    return accepted / proposed if proposed else None


def tokens_per_s(tokens: int, seconds: float) -> float | None:
    """Tokens over the seconds spent on them; None when no time was measured."""
    return tokens / seconds if seconds > 0 else None


def mean_accepted_length(emitted: int, verify_steps: int) -> float | None:
    """Tokens emitted per verify step, the bonus token included; None without verify steps."""
    return emitted / verify_steps if verify_steps else None


def _fp32_ordered(x: float) -> int:
    """The fp32 value's place on the number line as an integer (-0.0 and 0.0 alike)."""
    (bits,) = struct.unpack("<i", struct.pack("<f", x))
    return bits if bits >= 0 else -(bits & 0x7FFFFFFF)


def fp32_ulps(a: float, b: float) -> int:
    """How many fp32 values apart `a` and `b` are (0: the same value): the gap measured in
    the last place, which says whether rounding alone could have swapped them."""
    return abs(_fp32_ordered(a) - _fp32_ordered(b))


def same_fp32_bits(a: float | None, b: float | None) -> bool:
    """Two logprobs compared as the fp32 values they came from: sign of zero and NaN payload
    included; None (no logprob) equals only None."""
    if a is None or b is None:
        return a is b
    return struct.pack("<f", a) == struct.pack("<f", b)
