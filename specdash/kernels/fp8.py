"""Block-FP8 weights as checkpoints store them, in torch alone (no Triton): the weight type the
FP8 GEMM tile takes, the block quantization that makes one, and the dequantization the CPU runs.

A block-FP8 checkpoint (``quantization_config.weight_block_size`` [128, 128]) stores each linear
weight as float8_e4m3fn ``q`` [N, K] and float32 ``weight_scale_inv`` [ceil(N/128), ceil(K/128)],
the weight being ``q * scale`` block by block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor
BLOCK = 128
"""The one weight_block_size (both sides) the FP8 tile runs: its K step and SGLang's."""
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALE_FLOOR = 1e-10
"""An all-zero activation group's amax is raised to this before it becomes a scale (SGLang's
eps), so its scale is finite and its quantized values are zeros."""


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    """A linear weight of rows [q | rest]: `q` float8_e4m3fn [N, K] with float32 `scale`
    [ceil(N / group_n), K / 128], row n's block kb being `q[n, kb*128:] * scale[n // group_n, kb]`;
    `rest`: unquantized rows after q's (the GDN b|a rows fused into the input projection), or
    None. `group_n` is 128 as stored, or 1 once projections whose row counts are not multiples
    of 128 are fused (their scales expanded to one row per weight row)."""

    q: Tensor
    scale: Tensor
    group_n: int = BLOCK
    rest: Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.q.shape
        return (n + (0 if self.rest is None else self.rest.shape[0]), k)

    @property
    def nbytes(self) -> int:
        """Bytes a GEMM streams: the fp8 rows, their scales and the unquantized rows."""
        parts = [self.q, self.scale] + ([] if self.rest is None else [self.rest])
        return sum(t.numel() * t.element_size() for t in parts)

    @staticmethod
    def cat(parts: list[Fp8Weight]) -> Fp8Weight:
        """The weight of the parts' rows stacked (a fused projection): the stored scales where
        every part but the last has a multiple of 128 rows, else one scale row per weight row."""
        assert all(p.rest is None for p in parts)
        q = torch.cat([p.q for p in parts])
        stored = all(p.group_n == BLOCK for p in parts)
        if stored and all(p.q.shape[0] % BLOCK == 0 for p in parts[:-1]):
            return Fp8Weight(q, torch.cat([p.scale for p in parts]))
        return Fp8Weight(q, torch.cat([p.row_scales() for p in parts]), 1)

    def with_rest(self, rest: Tensor) -> Fp8Weight:
        return Fp8Weight(self.q, self.scale, self.group_n, rest)

    def row_scales(self) -> Tensor:
        """The scale of every weight row: [N, K / 128]."""
        if self.group_n == 1:
            return self.scale
        return self.scale.repeat_interleave(self.group_n, dim=0)[: self.q.shape[0]]


def quantize_blocks(w: Tensor) -> tuple[Tensor, Tensor]:
    """(q, scale) of `w` [N, K] per 128 x 128 block: scale = amax / 448 (an all-zero block's 1),
    q = clamp(w / scale) in float8_e4m3fn, as a block-FP8 checkpoint stores it."""
    n, k = w.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.zeros(nb * BLOCK, kb * BLOCK, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w
    blocks = padded.view(nb, BLOCK, kb, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(nb * BLOCK, kb * BLOCK)[:n, :k].contiguous(), scale


def dequantize(q: Tensor, scale: Tensor) -> Tensor:
    """`q * scale` block by block in fp32, each element rounded once: the weight an FP8
    checkpoint means, for a device that runs no FP8 GEMM."""
    n, k = q.shape
    full = scale.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)[:, :k]
    return q.to(torch.float32) * full
