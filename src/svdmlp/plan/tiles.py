"""Block sizes for the fused low-rank kernel, chosen from the on-chip budget (paper Eq. 10 and 11).

The paper's rule: the token block ``bm`` sets the arithmetic intensity (Eq. 10, higher with larger
``bm``) and the cached strip's size (``bm·r`` elements, Eq. 11); take the largest ``bm`` whose strip
and streamed blocks fit on chip. On Trainium the budget is the 24 MiB SBUF and the streamed blocks
follow the paper code's blocking. On a GPU the budget is one thread block's shared memory (227 KiB on
Hopper), a hundred times smaller, so the strip caps ``bm`` at 16 to 64 rows for LLM ranks; the
streamed blocks are Triton-sized and pipelined ``num_stages`` deep.
"""

from __future__ import annotations

from dataclasses import dataclass

from svdmlp.plan.cost import arithmetic_intensity, ceil_div, onchip_bytes
from svdmlp.plan.hardware import Hardware

# GPU. tl.dot needs every dimension >= 16, so 16 rows is the smallest token block; 128 rows is the
# largest row tile in Triton's matmul tutorial configs (beyond it the fp32 accumulator outgrows the
# register file).
GPU_TOKEN_BLOCKS = (16, 32, 64, 128)
# BK = BR = 64 bf16 elements = 128 bytes: one full 128-byte swizzled shared-memory row, the K tile of
# Triton's Hopper matmul configs.
GPU_STREAM_TILE = 64
GPU_BN = (128, 64)  # output columns per V block, widest first (more reuse of each strip load)
# Pipelining depths tried, deepest first: Triton's matmul tutorial uses 3 to 5 stages on Hopper; here
# every stage competes with the strip for shared memory, so 3 is the most we ask for.
GPU_STAGES = (3, 2)

# Trainium. The paper code's blocking for long sequences (S > 1024) of its down-projection kernel
# `fused_three_mm_XTUV` (paper.md §4.3): (contraction, rank, token, output) = (4, 2, 8, 4) tiles of
# (128, 128, 128, 512), i.e. BK = 512, BR = 256, BM = 1024, BN = 2048. BM is what we choose.
TRN_BK, TRN_BR, TRN_BN = 512, 256, 2048
TRN_PARTITIONS = 128  # SBUF/PE partitions: token blocks are multiples of this
TRN_TOKEN_BLOCKS = (128, 256, 512, 1024, 2048, 4096)  # the paper's block-size study (paper.md §4.1)


@dataclass(frozen=True)
class Blocks:
    """Block sizes of the fused kernel for one shape, and whether its on-chip working set fits.

    ``num_warps`` is None on Trainium (no warps); ``num_stages`` is 1 there (the paper's Eq. 11).
    """

    bm: int
    bn: int
    bk: int
    br: int
    num_warps: int | None
    num_stages: int
    onchip_bytes: int
    fits: bool

    def to_dict(self) -> dict:
        return {
            "bm": self.bm,
            "bn": self.bn,
            "bk": self.bk,
            "br": self.br,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "onchip_bytes": self.onchip_bytes,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class StudyRow:
    """One token block of a block-size study: Eq. 10 intensity, Eq. 11 bytes, and the spill."""

    bm: int
    intensity: float
    onchip_bytes: int
    fits: bool
    spill_bytes: int


def block_size_study(
    hw: Hardware, rank: int, bms: tuple[int, ...], bk: int, br: int, bn: int, dtype_bytes: int = 2
) -> list[StudyRow]:
    """Eq. 10 and Eq. 11 (one stage, as in the paper) for each token block in ``bms``."""
    rows = []
    for bm in bms:
        need = onchip_bytes(bm, rank, br, bk, bn, dtype_bytes)
        rows.append(
            StudyRow(
                bm=bm,
                intensity=arithmetic_intensity(rank, bm, dtype_bytes),
                onchip_bytes=need,
                fits=need <= hw.onchip_bytes,
                spill_bytes=max(0, need - hw.onchip_bytes),
            )
        )
    return rows


def _next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def _gpu_warps(bm: int, bn: int) -> int:
    # Triton's matmul tutorial gives 8 warps to 128×128-and-larger tiles and 4 to smaller ones.
    return 8 if bm * bn >= 128 * 128 else 4


def _gpu_blocks(hw: Hardware, m: int, k: int, n: int, rank: int, dtype_bytes: int) -> Blocks:
    cap = min(GPU_TOKEN_BLOCKS[-1], max(GPU_TOKEN_BLOCKS[0], _next_pow2(m)))
    bk, br = min(GPU_STREAM_TILE, k), min(GPU_STREAM_TILE, rank)
    for bm in sorted((b for b in GPU_TOKEN_BLOCKS if b <= cap), reverse=True):
        for stages in GPU_STAGES:
            for bn in GPU_BN:
                bn = min(bn, n)
                need = onchip_bytes(bm, rank, br, bk, bn, dtype_bytes, stages)
                if need <= hw.onchip_bytes:
                    return Blocks(bm, bn, bk, br, _gpu_warps(bm, bn), stages, need, True)
    # Even the smallest strip spills: report the smallest configuration as not fitting.
    bm, bn, stages = GPU_TOKEN_BLOCKS[0], min(GPU_BN[-1], n), GPU_STAGES[-1]
    need = onchip_bytes(bm, rank, br, bk, bn, dtype_bytes, stages)
    return Blocks(bm, bn, bk, br, _gpu_warps(bm, bn), stages, need, False)


def _trainium_blocks(hw: Hardware, m: int, k: int, n: int, rank: int, dtype_bytes: int) -> Blocks:
    cap = max(TRN_PARTITIONS, ceil_div(m, TRN_PARTITIONS) * TRN_PARTITIONS)
    bms = tuple(bm for bm in TRN_TOKEN_BLOCKS if bm <= cap) or TRN_TOKEN_BLOCKS[:1]
    bk, br, bn = min(TRN_BK, k), min(TRN_BR, rank), min(TRN_BN, n)
    rows = block_size_study(hw, rank, bms, bk, br, bn, dtype_bytes)
    fitting = [row for row in rows if row.fits]
    best = fitting[-1] if fitting else rows[0]
    return Blocks(best.bm, bn, bk, br, None, 1, best.onchip_bytes, best.fits)


def choose_blocks(hw: Hardware, m: int, k: int, n: int, rank: int, dtype_bytes: int = 2) -> Blocks:
    """Blocks for the fused kernel ``(m × k)·(k × rank)·(rank × n)`` on ``hw``.

    The largest token block (capped by ``m`` rounded up to a tile) whose strip and streamed blocks fit
    the on-chip budget; on a GPU the deepest pipelining and widest output block that still fit.
    """
    if hw.kind == "trainium":
        return _trainium_blocks(hw, m, k, n, rank, dtype_bytes)
    return _gpu_blocks(hw, m, k, n, rank, dtype_bytes)
