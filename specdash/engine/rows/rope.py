"""RoPE tables, and where the rows of a forward sit in them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdash.engine.config import ModelConfig
from specdash.engine.state import SeqState

Tensor = torch.Tensor


@dataclass(frozen=True, slots=True)
class Rope:
    """cos/sin for every position the model supports. Built once and never rebound: captured
    CUDA graphs hold these tables' addresses."""

    cos: Tensor
    sin: Tensor
    arange: Tensor

    @classmethod
    def build(cls, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> Rope:
        n_pos, r = cfg.max_position_embeddings, cfg.rotary_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
        freqs = torch.arange(n_pos, dtype=torch.float32)[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1).to(device)
        return cls(emb.cos().to(dtype), emb.sin().to(dtype), torch.arange(n_pos, device=device))

    def positions(self, state: SeqState, n: int) -> slice | Tensor:
        """Positions of the n new rows: a slice on an eager CPU state, a device tensor read at
        run time on CUDA (from `state.position`), so a captured graph is valid at every length."""
        if state.position is None:
            return slice(state.length, state.length + n)
        return state.position + self.arange[:n]
