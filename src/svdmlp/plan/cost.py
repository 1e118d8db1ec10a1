"""HBM bytes and FLOPs of the ways to run ``y = (x·U)·V``, and of a whole gated MLP: pure arithmetic.

Notation (the paper's, with the GPU names of the factor layout): ``x`` is ``m × k`` (tokens ×
in-features), ``U`` is ``k × r``, ``V`` is ``r × n``, ``s`` bytes per element. Four schedules:

- dense: one GEMM with ``W (k × n)``.
- round trip ("unfused"): ``x·U`` to HBM, then back for ``·V``: two launches, ``2·m·r`` extra bytes.
- fused: one launch; each program computes the strip ``x_blk·U`` (``bm × r``) on chip and streams
  ``V`` through it. ``splits`` programs share a token block, each recomputing the strip for its
  ``1/splits`` of the output columns: ``splits = 1`` is the paper's cached strip (§4.1), and
  ``splits = ⌈n / bn⌉`` its naive fusion (Algorithm 1) that recomputes the strip per output block.

Re-reads are explicit ``*_passes`` arguments: how many times an operand crosses HBM. The caller
(the planner) knows the hardware cache and the launch grid that decide them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Traffic:
    """What a schedule costs: HBM bytes moved, matrix FLOPs executed, kernel launches."""

    hbm_bytes: int
    flops: int
    launches: int

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(
            self.hbm_bytes + other.hbm_bytes, self.flops + other.flops, self.launches + other.launches
        )

    def to_dict(self) -> dict:
        return {"hbm_bytes": self.hbm_bytes, "flops": self.flops, "launches": self.launches}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def arithmetic_intensity(rank: int, bm: int, dtype_bytes: int) -> float:
    """Paper Eq. 10: FLOPs per HBM byte of the fused chain for token block ``bm``.

    ``2r / ((1 + r/bm)·s)``: one ``bm × bn`` output block costs ``2·bm·r·bn`` FLOPs and reads only its
    ``r × bn`` slice of V and writes ``bm × bn`` outputs, the strip staying on chip.
    """
    return 2 * rank / ((1 + rank / bm) * dtype_bytes)


def onchip_bytes(bm: int, rank: int, br: int, bk: int, bn: int, dtype_bytes: int, stages: int = 1) -> int:
    """Paper Eq. 11, with software pipelining: ``(bm·r + stages·(bm + br)·max(bk, bn))·s``.

    ``bm·r`` is the cached strip; ``bm·max(bk, bn)`` the x or output block; ``br·max(bk, bn)`` the U
    or V block. ``stages`` buffers of the streamed blocks are in flight at once (GPU pipelining;
    the paper's form is ``stages = 1``).
    """
    return (bm * rank + stages * (bm + br) * max(bk, bn)) * dtype_bytes


def weight_passes(nbytes: int, sweeps: int, cache_bytes: int) -> int:
    """HBM passes over an operand that ``sweeps`` successive waves of programs read.

    An operand that fits in half the hardware cache is read from HBM once (the other half serves the
    streams that pass through); otherwise each wave reads it again.
    """
    return 1 if nbytes <= cache_bytes // 2 else sweeps


def dense(m: int, k: int, n: int, s: int, w_passes: int = 1) -> Traffic:
    """One GEMM ``(m × k)·(k × n)``."""
    return Traffic(s * (m * k + k * n * w_passes + m * n), 2 * m * k * n, 1)


def elementwise(elements_read: int, elements_written: int, s: int) -> Traffic:
    """One elementwise launch (SiLU, a product): bytes only, no matrix FLOPs."""
    return Traffic(s * (elements_read + elements_written), 0, 1)


def round_trip(m: int, k: int, n: int, r: int, s: int, u_passes: int = 1, v_passes: int = 1) -> Traffic:
    """Unfused low-rank: two GEMMs whose ``m × r`` intermediate is written to HBM and read back."""
    return Traffic(
        s * (m * k + k * r * u_passes + 2 * m * r + r * n * v_passes + m * n), 2 * m * r * (k + n), 2
    )


def fused(
    m: int,
    k: int,
    n: int,
    r: int,
    s: int,
    bm: int,
    splits: int,
    x_passes: int = 1,
    u_passes: int = 1,
    v_passes: int = 1,
) -> Traffic:
    """One fused launch, token blocks of ``bm`` rows, the strip computed ``splits`` times per block.

    FLOPs count what the matrix units execute: every token block is ``bm`` rows, partly padding when
    ``m`` is not a multiple, and the shrink ``x·U`` is repeated ``splits`` times.
    """
    rows = ceil_div(m, bm) * bm
    flops = 2 * rows * k * r * splits + 2 * rows * r * n
    return Traffic(s * (m * k * x_passes + k * r * u_passes + r * n * v_passes + m * n), flops, 1)


def mlp_weight_elements(hidden: int, intermediate: int, ranks: tuple[int, int, int] | None) -> int:
    """Weight elements of a gated MLP: ``3·h·i`` dense, ``Σ r·(in + out)`` low-rank (gate, up, down)."""
    if ranks is None:
        return 3 * hidden * intermediate
    return sum(ranks) * (hidden + intermediate)


def mlp_ideal(
    m: int,
    hidden: int,
    intermediate: int,
    ranks: tuple[int, int, int] | None,
    s: int,
    weight_bytes: int | None = None,
) -> Traffic:
    """The floor's traffic for a gated MLP: x read once, weights once, output written once.

    Intermediates never touch HBM and nothing is re-read: the least any implementation can move.
    ``ranks=None`` is the dense MLP; FLOPs are those of its three (or six) matrix products.
    ``weight_bytes``: the weights' bytes as stored, when not ``s`` per weight (quantized factors).
    """
    weights = mlp_weight_elements(hidden, intermediate, ranks)
    if ranks is None:
        flops = 2 * m * 3 * hidden * intermediate
    else:
        flops = 2 * m * weights
    return Traffic(s * 2 * m * hidden + (s * weights if weight_bytes is None else weight_bytes), flops, 0)


def floor_seconds(traffic: Traffic, bandwidth: float, peak_flops: float) -> float:
    """Roofline floor: ``max(bytes / bandwidth, FLOPs / peak)``."""
    return max(traffic.hbm_bytes / bandwidth, traffic.flops / peak_flops)
