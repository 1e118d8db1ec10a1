"""Schedules and block sizes, chosen from the problem's shape (no autotuning: it needs a GPU driver,
and a heuristic keeps the first call and CUDA-graph capture free of benchmarking).

Three regimes (design.md §4), each launch's grid, occupancy and bytes in flight checked by the launch
model's rules (:mod:`svdmlp.plan.launches`, ``svdmlp plan --launches``):
- decode (M ≤ DECODE_MAX_TOKENS): the work is streaming the factors from HBM once; the tiles are
  narrow along the weight's output dimension so that there are at least as many programs as SMs,
  and software-pipelined deeply so that each SM keeps enough bytes in flight;
- small batches (M ≤ SMALL_BATCH_MAX_TOKENS): the gated expand still streams V_g and V_u; its token
  tiles shrink and its column blocks narrow until the grid fills the SMs;
- prefill: compute-bound; the usual 128-row tensor-core tiles, with grouped tile order for L2 reuse.
Above decode, plain GEMMs (the shrink, the two-stage down projection) go to the vendor library
(:func:`svdmlp.kernels.common.library_matmul`): Triton stays where fusion buys something.

Under the Triton interpreter a single config is used for everything: interpreter time grows with
the number of programs times loop iterations, so the blocks are large, but not so large that the
test shapes (in/out ≤ 256) would take each loop only once: then the loop advances go untested.

The register and shared-memory figures quoted below come from compiling each config for sm_90 on
a CPU (``python -m svdmlp.kernels.aot``); the 16-bit decode tiles were chosen by measurement on an
H200, the rest by the model (BENCHMARKS.md, 2026-12-04).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch
import triton

# At or below this many tokens the factors' bytes dominate the traffic (M·in ≪ in·r for r ≥ 16),
# so the decode schedule (weight streaming spread over all SMs) wins; 16 is also the smallest
# M tile of a tensor-core dot, so a decode M tile covers all tokens at once.
DECODE_MAX_TOKENS = 16

# The fused linear keeps the whole strip x·U (BLOCK_M × padded rank, fp32) in registers: 64 × 256 × 4 B
# = 64 KB, a quarter of an H200 SM's 256 KB register file, is the most that leaves room for the tiles.
# sm_90 compiles: bf16 at rank 256 takes 255 registers without spilling; fp32 at rank 128 spills.
FUSED_MAX_RANK = {torch.float16: 256, torch.bfloat16: 256, torch.float32: 64}

# The interpreter has no register file: one limit for every dtype, so the tests cover fp32 too.
INTERPRET_FUSED_MAX_RANK = 256

# An H200 SM has 228 KB of shared memory (227 KB usable per block); keep software-pipelined stages
# below 160 KB so that the compiler's own scratch (layout conversions, the epilogue) still fits.
SMEM_STAGE_BUDGET = 160 * 1024

# The fused linear runs when its programs fill this share of the SMs: a single wave on most SMs beats
# many waves of smaller GEMM tiles plus a strip round trip.
FUSED_MIN_WAVE_SHARE = 0.9

# Above decode and up to this many tokens the gated expand still streams its factors (M·r ≪ r·inter):
# its tiles keep the grid full and the bytes in flight up; above it, it is compute-bound.
SMALL_BATCH_MAX_TOKENS = 256

# Decode: weight bytes each program keeps in flight (software-pipelined loads). By Little's law an H200
# needs ~4.3 TB/s × ~1 µs ≈ 4 MB in flight, ~32 KB per SM; small tiles get there with more stages.
DECODE_BYTES_IN_FLIGHT = 32 * 1024

# Interpreter blocks: 64 wide (the tests' dims up to 256 make loops of 2-4 steps), rank blocks of 32 so
# that the test ranks 40 and 72 take several rank steps.
INTERPRET_BLOCK = 64
INTERPRET_RANK_BLOCK = 32


@dataclass(frozen=True)
class MatmulTiles:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8  # tiles along M visited together so that their B columns stay in L2
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class GatedExpandTiles:
    block_m: int
    block_n: int  # columns of the intermediate (inter) per program
    block_r: int  # rank step of the gate/up expand
    block_rd: int  # rank step of the fused down shrink (decode only)
    group_m: int = 8  # as in MatmulTiles
    num_warps: int = 4
    num_stages: int = 3  # of the gate/up loop(s)
    down_stages: int = 3  # of the fused down shrink's loop, pipelined on its own


@dataclass(frozen=True)
class FusedLinearTiles:
    block_m: int
    block_k: int
    rank_pad: int  # the whole rank in one block: the strip never leaves the chip
    block_n: int
    n_splits: int  # programs per token block, each recomputing the strip for its share of N
    num_warps: int = 4
    num_stages: int = 2


def pow2_clamp(n: int, low: int, high: int) -> int:
    """The power of two ≥ n, clamped to [low, high]."""
    return max(low, min(high, triton.next_power_of_2(max(1, n))))


def _index(device: torch.device) -> int:
    """The CUDA device's index (the current one when ``device`` names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors on ``device`` (asked once per device; 1 off CUDA)."""
    if device.type != "cuda":
        return 1
    return _sm_count(_index(device))


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def programmatic_launch(device: torch.device, interpreted: bool) -> bool:
    """Whether the decode chain's launches use programmatic dependent launch (sm_90 and newer): each
    kernel lets the next one start launching at once and waits for its predecessor's writes before
    touching memory, so a launch's start overlaps the previous kernel's tail. ``SVDMLP_PDL=0`` turns
    it off (a driver or graph capture that mishandles it)."""
    if interpreted or device.type != "cuda" or os.environ.get("SVDMLP_PDL", "1") == "0":
        return False
    return _capability(_index(device)) >= (9, 0)


def prefetch_rows(rows: int, dependent: bool, contiguous: bool) -> int:
    """How many of its ``rows`` weight rows a launch asks L2 for before it waits for its predecessor
    (:func:`svdmlp.kernels.common.prefetch_l2`): a share of them, ``SVDMLP_PREFETCH`` (0 to 1), for a
    dependent launch of the decode chain whose weight rows are contiguous; 0 (off) by default until
    timed on a device (``benchmarks/decode_tiles.py --chain`` times it beside PDL off and on)."""
    text = os.environ.get("SVDMLP_PREFETCH", "0")
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise ValueError(f"SVDMLP_PREFETCH must be a share of the weight rows in [0, 1], got {text!r}")
    return int(share * rows) if dependent and contiguous else 0


def streaming_stages(weight_stage_bytes: int, smem_stage_bytes: int, most: int = 12) -> int:
    """Pipeline depth that keeps DECODE_BYTES_IN_FLIGHT of weights in flight while one stage computes
    (``stages - 1`` loads ahead), within the shared-memory budget."""
    wanted = 1 + -(-DECODE_BYTES_IN_FLIGHT // weight_stage_bytes)
    return max(2, min(most, wanted, SMEM_STAGE_BUDGET // smem_stage_bytes))


def _narrow_block(n: int, sms: int, widths: tuple[int, ...]) -> int:
    """The widest block that still gives every SM a program (else the narrowest)."""
    for width in widths:
        if triton.cdiv(n, width) >= sms:
            return width
    return widths[-1]


def matmul_tiles(m: int, n: int, k: int, dtype: torch.dtype, sms: int, interpreted: bool) -> MatmulTiles:
    """Tiles of ``(m, k) @ (k, n)``: a shrink x·U, an expand t·V or the decode down expand."""
    if interpreted:
        return MatmulTiles(
            pow2_clamp(m, 16, INTERPRET_BLOCK), pow2_clamp(n, 16, INTERPRET_BLOCK), INTERPRET_BLOCK
        )
    size = dtype.itemsize
    if m <= DECODE_MAX_TOKENS and size == 2:
        # Weight streaming, 16-bit, as measured on an H200 (benchmarks/decode_tiles.py, BENCHMARKS.md
        # 2026-12-04): of ten layouts, 32-wide column slabs with 128-deep K steps and 6 stages (40 KB
        # in flight per program) were fastest or within 10% of it on every decode shrink and down
        # expand of three models, 1.1-1.4x faster than the full wave of 16-wide slabs the rule below
        # gives, though the 1B shrink then runs 80 programs on 132 SMs.
        return MatmulTiles(16, 32, 128, group_m=1, num_warps=4, num_stages=6)
    if m <= DECODE_MAX_TOKENS:
        # Weight streaming: one M tile; output columns split so that every SM streams a share.
        # Tiles stay small because mma with a 16-row tile holds its operands in registers (sm_90
        # compiles: 16x64x128 needs 251 registers, 16x64x256 spills; 16x64x64 needs 140), and the
        # bytes in flight come from a deep pipeline instead (stages cost shared memory, not registers).
        block_n = _narrow_block(n, sms, (64, 32, 16))
        block_k = 128 if block_n == 16 and size == 2 else 64
        weight_stage = block_k * block_n * size
        smem_stage = 16 * block_k * 4 + weight_stage  # `a` may be the fp32 down strip
        stages = streaming_stages(weight_stage, smem_stage)
        return MatmulTiles(16, block_n, block_k, group_m=1, num_warps=4, num_stages=stages)
    if size == 4:
        # fp32 runs FMA dots (IEEE): smaller tiles keep the register use of two fp32 operands down.
        return MatmulTiles(pow2_clamp(m, 16, 64), pow2_clamp(n, 16, 64), 32, num_warps=4, num_stages=3)
    # 16-bit prefill: 128 × 128 × 64 tensor-core tiles, 32 KB per stage, 3 stages.
    block_m = pow2_clamp(m, 16, 128)
    block_n = pow2_clamp(n, 16, 128)
    warps = 8 if block_m * block_n >= 128 * 128 else 4
    return MatmulTiles(block_m, block_n, 64, num_warps=warps, num_stages=3)


def _full_wave_expand_tiles(n: int, size: int, sms: int) -> GatedExpandTiles:
    """The decode gated expand's tiles by the bytes-in-flight model (fp32, and the quantized kernel's
    starting point; 16-bit float tiles are measured ones, see :func:`gated_expand_tiles`).

    Every program reads an (r × block_n) slice of V_g and V_u and a (block_n × r_down) slice of
    U_down once, so the n split alone spreads all three weight streams over the SMs; wider blocks mean
    fewer fp32 atomics into the down strip (m · r_down per program). The down loop's slices are small
    (block_n × block_rd), so it gets a pipeline of its own, deep enough for the same bytes in flight;
    down-rank steps of 64 at block_n 32 (32 at 64) bound the registers.
    """
    block_n = _narrow_block(n, sms, (64, 32))
    block_r = 128 if size == 2 else 64
    block_rd = 32 if block_n == 64 else 64
    weight_stage = 2 * block_r * block_n * size  # gate and up slices, one merged loop
    stages = streaming_stages(weight_stage, weight_stage + 2 * 16 * block_r * size, most=4)
    down_stage = block_n * block_rd * size
    down_stages = streaming_stages(down_stage, down_stage)
    return GatedExpandTiles(
        16, block_n, block_r, block_rd, group_m=1, num_warps=4, num_stages=stages, down_stages=down_stages
    )


def gated_expand_tiles(
    m: int, n: int, dtype: torch.dtype, sms: int, interpreted: bool, decode: bool
) -> GatedExpandTiles:
    """Tiles of ``act(t_g·V_g) · (t_u·V_u)`` over ``n`` intermediate columns (+ the down shrink at decode)."""
    if interpreted:
        return GatedExpandTiles(
            pow2_clamp(m, 16, INTERPRET_BLOCK),
            pow2_clamp(n, 16, INTERPRET_BLOCK),
            INTERPRET_RANK_BLOCK,
            INTERPRET_RANK_BLOCK,
        )
    size = dtype.itemsize
    if decode and size == 2:
        # 16-bit, as measured on an H200 (benchmarks/decode_tiles.py, BENCHMARKS.md 2026-12-04): wide
        # column blocks at 8 warps beat the narrow full-wave rule below by 1.1-1.3x: fewer programs
        # mean fewer atomics into the down strip and more bytes in flight each. 64 wide while that is
        # at most one program per SM, else 128 (the 8B shape's 14336 columns: 112 programs).
        if triton.cdiv(n, 64) <= sms:
            return GatedExpandTiles(16, 64, 128, 64, group_m=1, num_warps=8, num_stages=3, down_stages=6)
        return GatedExpandTiles(16, 128, 64, 64, group_m=1, num_warps=8, num_stages=3, down_stages=4)
    if decode:
        return _full_wave_expand_tiles(n, size, sms)
    if size == 4:
        return GatedExpandTiles(
            pow2_clamp(m, 16, 64), pow2_clamp(n, 16, 64), 32, 32, num_warps=4, num_stages=2
        )
    if m <= SMALL_BATCH_MAX_TOKENS:
        # Small batches still stream V_g and V_u: token tiles of at most 64 rows and narrow column
        # blocks so that the grid fills every SM, and enough stages for the bytes in flight that the
        # weight stream needs. Rank steps of 64 at 8 warps (sm_90 compiles, bf16: 100-174 registers;
        # steps of 128 at 4 warps spill at block_n 32).
        block_m = pow2_clamp(m, 16, 64)
        m_tiles = -(-m // block_m)
        block_n = _narrow_block(n, -(-sms // m_tiles), (64, 32))
        weight_stage = 2 * 64 * block_n * size
        stages = streaming_stages(weight_stage, weight_stage + 2 * block_m * 64 * size, most=5)
        return GatedExpandTiles(block_m, block_n, 64, 64, num_warps=8, num_stages=stages)
    # Two fp32 accumulators (gate, up): 128 × 64 each is 64 registers per thread at 8 warps.
    return GatedExpandTiles(pow2_clamp(m, 16, 128), pow2_clamp(n, 16, 64), 64, 64, num_warps=8, num_stages=3)


def quantized_gated_expand_tiles(
    m: int, n: int, dtype: torch.dtype, bits: int, sms: int, interpreted: bool
) -> GatedExpandTiles:
    """Tiles of the decode gated expand on ``bits``-bit factors: the full-wave decode tiles with half
    their rank step, since the dequantized V_g and V_u tiles are held in registers (the float kernel's go to
    shared memory by asynchronous copies and stay there), and pipelines as deep as the smaller integer
    stages need for the same bytes in flight. sm_90 compiles, 16-bit, ranks a multiple of 32 (rows of
    whole vectors): 66-119 registers; rank 1911 (byte loads): 226-254, no spills."""
    if interpreted:
        return gated_expand_tiles(m, n, dtype, sms, interpreted, decode=True)
    tiles = _full_wave_expand_tiles(n, dtype.itemsize, sms)
    block_r = tiles.block_r // 2
    down_stage = tiles.block_n * tiles.block_rd * bits // 8
    down_stages = streaming_stages(down_stage, down_stage)
    if dtype.itemsize == 4:
        # fp32's FMA dots hold their operands in registers too: 8 warps share them and 2 stages leave
        # room (sm_90 compiles: 4 warps spill ~600 B at rank 1911, 4 stages 8 B at rank 1024).
        return dataclasses.replace(tiles, block_r=block_r, num_warps=8, num_stages=2, down_stages=down_stages)
    weight_stage = 2 * block_r * tiles.block_n * bits // 8
    stages = streaming_stages(weight_stage, weight_stage + 2 * 16 * block_r * dtype.itemsize, most=4)
    return dataclasses.replace(tiles, block_r=block_r, num_stages=stages, down_stages=down_stages)


def fused_linear_tiles(
    m: int, k: int, r: int, n: int, dtype: torch.dtype, sms: int, interpreted: bool
) -> FusedLinearTiles | None:
    """Tiles of the fused linear (strip kept on chip), or None when the rank exceeds the register budget."""
    rank_pad = pow2_clamp(r, 16, 1 << 30)
    if rank_pad > (INTERPRET_FUSED_MAX_RANK if interpreted else FUSED_MAX_RANK[dtype]):
        return None
    if interpreted:
        block_n = pow2_clamp(n, 16, INTERPRET_BLOCK)
        # Two splits when there are two N blocks, so that the split bookkeeping is exercised.
        n_splits = min(2, triton.cdiv(n, block_n))
        return FusedLinearTiles(
            pow2_clamp(m, 16, INTERPRET_BLOCK), INTERPRET_BLOCK, rank_pad, block_n, n_splits
        )
    block_m = pow2_clamp(m, 16, 64)
    block_n = 64
    # Each extra split recomputes the shrink (k·r FLOPs per token) for its share of N (r·n/splits):
    # allow at most ~25% extra FLOPs, and no more splits than it takes to give every SM a program.
    max_splits = 1 + (k + n) // (4 * k)
    n_splits = max(1, min(triton.cdiv(sms, triton.cdiv(m, block_m)), triton.cdiv(n, block_n), max_splits))
    block_k = 64 if dtype.itemsize == 2 else 32
    return FusedLinearTiles(block_m, block_k, rank_pad, block_n, n_splits, num_warps=8, num_stages=2)


def linear_schedule(m: int, k: int, r: int, n: int, dtype: torch.dtype, sms: int, interpreted: bool) -> str:
    """``"fused"`` (one kernel, strip on chip) or ``"two_stage"`` (shrink GEMM, then expand GEMM).

    The fused kernel parallelises over token blocks (times a few N splits) only, so on a GPU it runs
    when those fill (nearly) every SM and the rank fits the register budget (large-M prefill at small rank).
    Otherwise two GEMMs parallelise over every dimension; their strip round trip through L2/HBM costs
    2·M·r·bytes against 2·M·r·(in + out) FLOPs, a few percent at most. At decode the two stages are
    what lets the shrink's weight stream spread over all SMs. Under the interpreter, fused whenever
    it can run (one program per token block is also the cheapest to interpret).
    """
    if m <= DECODE_MAX_TOKENS:
        return "two_stage"
    tiles = fused_linear_tiles(m, k, r, n, dtype, sms, interpreted)
    if tiles is None:
        return "two_stage"
    if interpreted or triton.cdiv(m, tiles.block_m) * tiles.n_splits >= FUSED_MIN_WAVE_SHARE * sms:
        return "fused"
    return "two_stage"
