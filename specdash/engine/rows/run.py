"""The sequences of one forward that step together, and how their row blocks join."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdash.engine.state import PooledSteps, SeqState

Tensor = torch.Tensor


@dataclass(slots=True)
class Run:
    """Consecutive sequences of one forward with `rows` rows each. `pooled` when they are slots
    of one pool and the implementation steps slots together: then each op is one launch for
    the whole run, at the slots `pooled.slots` and lengths `starts`."""

    states: list[SeqState]
    rows: int
    pooled: PooledSteps | None = None
    starts: Tensor | None = None

    @property
    def size(self) -> int:
        """Rows of the whole run."""
        return len(self.states) * self.rows


def cat_rows(parts: list[Tensor]) -> Tensor:
    """The row blocks of several sequences (or runs) as one tensor; one block is returned as is."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)
