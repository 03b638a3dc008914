"""The numbers every view shows, each defined once: the dashboard, the headless summary, the
audit, the report and the CSV export all compute them here (docs: the dashboard glossary)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


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


def token_difference(
    id_a: int, logprob_a: float | None, id_b: int, logprob_b: float | None
) -> Literal["token", "logprob"] | None:
    """How two runs' tokens at one position differ: "token" (the ids), "logprob" (the same
    id, other fp32 logprob bits), or None (the same bits). Every comparison of two runs, live
    or recorded, is this one."""
    if id_a != id_b:
        return "token"
    return None if same_fp32_bits(logprob_a, logprob_b) else "logprob"


@dataclass(slots=True)
class Comparison:
    """Two runs of one prompt compared position by position as their tokens arrive: where the
    first bit divergence is, and the first change of text (token id)."""

    compared: int = 0
    """Positions compared so far."""
    bits_at: int | None = None
    """The first position whose id or fp32 logprob bits differ."""
    text_at: int | None = None
    """The first position whose token id differs."""

    def advance(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float | None],
        other_ids: Sequence[int],
        other_logprobs: Sequence[float | None],
    ) -> list[int]:
        """Compare the positions both runs have produced since the last call; the positions
        found: the first bit divergence, and the first id divergence when it comes later (the
        text changed too). Nothing is left to find once the text has diverged."""
        found = []
        end = min(len(ids), len(other_ids))
        for pos in range(self.compared, end):
            if self.text_at is not None:
                break
            what = token_difference(ids[pos], logprobs[pos], other_ids[pos], other_logprobs[pos])
            if what is not None and self.bits_at is None:
                self.bits_at = pos
                found.append(pos)
            if what == "token":
                self.text_at = pos
                if pos != self.bits_at:
                    found.append(pos)
        self.compared = max(self.compared, end)
        return found
