"""Gram matrices ``XᵀX`` of activation batches, accumulated in float64: what every calibration
statistic (input Grams, output-gradient Grams, closed-form healing's cross Grams) is built from."""

from __future__ import annotations

import torch

from svdmlp.decompose import strips

# XᵀX is symmetric: computing only the block upper triangle (and adding it mirrored) over 4 row
# strips does 10/16 of the GEMM work. Measured on 2 cores for a (2048, 1536) batch: 0.093 s vs
# 0.141 s for the full product (2 blocks 0.111 s, 6 blocks 0.095 s); about 13 s of SmolLM2's
# 32×512-token calibration. Strip by strip, a batch's product never exists whole: its float32 and
# float64 copies of an 8192² Gram were 0.8 GB on top of the accumulator.
GRAM_BLOCKS = 4
# Rows gathered before :class:`BufferedGram` updates its Gram. Every update reads and writes the whole
# float64 Gram and makes a float64 copy of each strip, whatever the batch's rows: for 513-token windows
# and an 8960-wide projection (Qwen2.5-Coder-1.5B's intermediate) that costs about as much as the product
# itself (2 cores: 4104 rows in 8 batches 11.2 s, in 2 batches 6.8 s). 2048 rows of float32 are 73 MB at
# that width.
GRAM_ROWS = 2048


def accumulate_gram(target: torch.Tensor, x: torch.Tensor, blocks: int = GRAM_BLOCKS) -> None:
    """Add ``xᵀx`` of a batch of activations ``x (..., d)`` into the float64 accumulator ``target (d, d)``.

    One strip of rows at a time, each off-diagonal block computed once: in float32 (fast GEMM, error
    ~1e-6 relative), added in float64 across batches.
    """
    flat = x.detach().reshape(-1, x.shape[-1]).float()
    for start, stop in strips(flat.shape[1], blocks):
        strip = (flat[:, start:stop].T @ flat[:, start:]).to(torch.float64)  # (stop - start, d - start)
        target[start:stop, start:] += strip
        target[stop:, start:stop] += strip[:, stop - start :].T


def accumulate_product(
    target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, blocks: int = GRAM_BLOCKS
) -> None:
    """Add ``aᵀb`` of two batches ``(tokens, d)`` into the float64 accumulator ``target (d, d)``, one
    strip of rows at a time (as :func:`accumulate_gram`, without the symmetry)."""
    a, b = a.detach().float(), b.detach().float()
    for start, stop in strips(a.shape[1], blocks):
        target[start:stop] += (a[:, start:stop].T @ b).to(torch.float64)


class BufferedGram:
    """``Σ xᵀx`` over many small batches into the float64 Gram ``target``, made :data:`GRAM_ROWS` rows at a
    time: the rows are copied into one float32 buffer, and :func:`accumulate_gram` runs when it is full
    and on :meth:`flush`, which the caller owes once the last batch is in."""

    def __init__(self, target: torch.Tensor, rows: int = GRAM_ROWS):
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        self.target, self.rows = target, rows
        self.buffer: torch.Tensor | None = None
        self.filled = 0

    def add(self, x: torch.Tensor) -> None:
        """Take the rows of a batch of activations ``x (..., d)``."""
        flat = x.detach().reshape(-1, x.shape[-1])
        if self.buffer is None:
            self.buffer = torch.empty(self.rows, flat.shape[1], dtype=torch.float32, device=flat.device)
        start = 0
        while start < flat.shape[0]:
            take = min(self.rows - self.filled, flat.shape[0] - start)
            self.buffer[self.filled : self.filled + take] = flat[start : start + take]
            self.filled += take
            start += take
            if self.filled == self.rows:
                self.flush()

    def flush(self) -> None:
        """Add the rows taken so far into the Gram."""
        if self.filled:
            accumulate_gram(self.target, self.buffer[: self.filled])
            self.filled = 0
