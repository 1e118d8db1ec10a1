"""The launch model: every kernel launch of the Triton backend's MLP on a GPU, and its predicted time.

The launches are captured from the real launchers (:mod:`svdmlp.kernels.capture`) with the tiles the
configs pick for the GPU's SM count, so the model can never describe a schedule the code does not run.
For each launch: programs, waves over the SMs and programs resident per SM (shared memory and warps;
registers are the ahead-of-time compile's to check), the pipelined loops of a program with the bytes
each keeps in flight per SM, HBM bytes and matrix FLOPs, and a time:

- a loop moving B bytes from HBM runs at ``min(bandwidth, busy SMs × bytes in flight per SM / latency)``
  (Little's law); the loops of a program run one after another, so their times add, and stores go at
  full bandwidth;
- the matrix units need ``waves × programs per SM × FLOPs per program / (per-SM peak × efficiency)``
  (wave quantisation);
- a launch takes the larger of the two plus a fixed cost (launch, ramp-up, drain).

A library GEMM (cuBLAS) and the dense and unfused baselines are taken at the roofline of the whole
machine plus the same fixed cost. Every number here is a prediction for the device run to check
(BENCHMARKS.md); the constants below are the assumptions to correct once it has run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from svdmlp.plan.cost import Traffic, ceil_div, floor_seconds, mlp_ideal
from svdmlp.plan.hardware import Hardware
from svdmlp.plan.planner import MLPRanks, dense_mlp_parts, gemm, torch_unfused_mlp_parts
from svdmlp.plan.shapes import MLPShape

if TYPE_CHECKING:  # the planner's tables import this module; torch only loads when predicting
    import torch

# HBM latency under load that Little's law divides by: ~1 µs on Hopper, which makes 32 KB in flight per
# SM (DECODE_BYTES_IN_FLIGHT in the kernel configs) what 132 SMs need to pull 4.3 TB/s.
LATENCY_S = 1e-6
# What the rules ask of every weight-streaming loop at M <= IN_FLIGHT_MAX_TOKENS.
IN_FLIGHT_RULE_BYTES = 32 * 1024
IN_FLIGHT_MAX_TOKENS = 256
# Fixed cost of one launch inside a CUDA graph: launch, ramp-up and the drain of the previous kernel.
# Measured on an H200 (BENCHMARKS.md, 2026-12-04): cuBLAS's decode GEMVs of 10.5, 17 and 42 MB took
# 6.2, 8.6 and 17.4 µs as single-launch graphs, a line with a 2.5 µs intercept (the GPU review had
# guessed 1.5 µs).
LAUNCH_S = 2.5e-6
# Warps one SM holds at once (Ampere and Hopper).
MAX_WARPS_PER_SM = 64
# Share of the measured matrix peak (cuBLAS's) that a Triton kernel of plain pointer loads reaches:
# no TMA, no warp specialisation (an assumption until measured).
TRITON_MMA_EFFICIENCY = 0.7
# 16-bit decode tiles were chosen by timing ten layouts per launch on an H200 (BENCHMARKS.md,
# 2026-12-04): wider blocks with more bytes in flight each beat a full wave of narrow ones, so a decode
# launch may run fewer programs than SMs (DECODE_MAX_TOKENS in the kernel configs, not imported: Triton).
MEASURED_DECODE_MAX_TOKENS = 16
MEASURED_DECODE_REASON = "16-bit decode tiles, measured faster than a full wave of narrower ones"
# The narrowest tile of a tensor-core dot: a launch with fewer than one wave of programs is fine only
# when even tiles this small could not fill the SMs.
NARROWEST_TILE = 16


@dataclass(frozen=True)
class Loop:
    """One software-pipelined loop of a program: its operands' bytes per stage and in flight per SM."""

    name: str
    weight_stage_bytes: int  # factor bytes one program loads per pipeline stage
    other_stage_bytes: int  # activation bytes per stage (the strip, x)
    stages: int
    hbm_bytes: int  # what the whole launch reads through this loop
    weight_in_flight_per_sm: int
    seconds: float

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "weight_stage_bytes": self.weight_stage_bytes,
            "other_stage_bytes": self.other_stage_bytes,
            "stages": self.stages,
            "hbm_bytes": self.hbm_bytes,
            "weight_in_flight_per_sm": self.weight_in_flight_per_sm,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class LaunchPrediction:
    """One launch as the model sees it."""

    kernel: str
    tiles: str
    programs: int  # 0 for a library GEMM (its grid is the library's)
    waves: int
    per_sm: int  # programs resident at once on the least loaded busy SM
    loops: tuple[Loop, ...]
    hbm_bytes: int
    flops: int
    atomics: int  # fp32 atomic adds
    seconds: float
    bound: str  # "memory", "compute" or "fixed" (the launch cost is over half the time)
    reason: str | None  # why fewer programs than SMs is fine, when there are fewer

    @property
    def library(self) -> bool:
        return self.programs == 0

    def min_weight_in_flight(self) -> int | None:
        """The least factor bytes any weight-streaming loop keeps in flight per SM (None: no such loop)."""
        streams = [loop.weight_in_flight_per_sm for loop in self.loops if loop.weight_stage_bytes]
        return min(streams) if streams else None

    def to_dict(self) -> dict:
        return {
            "kernel": self.kernel,
            "tiles": self.tiles,
            "programs": self.programs,
            "waves": self.waves,
            "per_sm": self.per_sm,
            "loops": [loop.to_dict() for loop in self.loops],
            "hbm_bytes": self.hbm_bytes,
            "flops": self.flops,
            "atomics": self.atomics,
            "seconds": self.seconds,
            "bound": self.bound,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Occupancy:
    """How a launch's programs spread over the SMs."""

    programs: int
    busy_sms: int
    most_per_sm: int  # programs the busiest SM runs, over all waves (what the matrix units see)
    least_resident: int  # programs resident at once on the least loaded busy SM (what it keeps in flight)
    waves: int


def occupancy(hw: Hardware, programs: int, smem_per_program: int, num_warps: int) -> Occupancy:
    """Resident programs per SM are limited by shared memory and warps (registers: see the AOT compile)."""
    fit = max(1, min(hw.onchip_bytes // max(1, smem_per_program), MAX_WARPS_PER_SM // num_warps))
    busy = min(programs, hw.units)
    return Occupancy(
        programs=programs,
        busy_sms=busy,
        most_per_sm=ceil_div(programs, hw.units),
        least_resident=max(1, min(fit, programs // hw.units)),
        waves=ceil_div(programs, hw.units * fit),
    )


def reads(nbytes: int, block_bytes: int, sweeps: int, cache_bytes: int) -> int:
    """HBM bytes of an operand read by ``sweeps`` tiles along the other dimension: once if the share
    that programs running together read (``block_bytes``) stays in half of L2, else once per sweep."""
    return nbytes * (1 if block_bytes <= cache_bytes // 2 else sweeps)


def _loop(
    hw: Hardware, where: Occupancy, name: str, weight_stage: int, other_stage: int, stages: int, hbm: int
) -> Loop:
    """A loop keeps ``stages - 1`` stages in flight while it computes on one."""
    in_flight = where.least_resident * (stages - 1)
    bandwidth = min(hw.bandwidth, where.busy_sms * in_flight * (weight_stage + other_stage) / LATENCY_S)
    return Loop(name, weight_stage, other_stage, stages, hbm, in_flight * weight_stage, hbm / bandwidth)


def _finish(
    hw: Hardware,
    kernel: str,
    tiles: str,
    where: Occupancy,
    loops: list[Loop],
    stored: int,
    flops_per_program: int,
    atomics: int,
    reason: str | None,
) -> LaunchPrediction:
    memory = sum(loop.seconds for loop in loops) + stored / hw.bandwidth
    per_sm_peak = hw.peak_flops / hw.units * TRITON_MMA_EFFICIENCY
    compute = where.most_per_sm * flops_per_program / per_sm_peak
    work = max(memory, compute)
    bound = "fixed" if LAUNCH_S > work else ("memory" if memory >= compute else "compute")
    return LaunchPrediction(
        kernel=kernel,
        tiles=tiles,
        programs=where.programs,
        waves=where.waves,
        per_sm=where.least_resident,
        loops=tuple(loops),
        hbm_bytes=sum(loop.hbm_bytes for loop in loops) + stored,
        flops=where.programs * flops_per_program,
        atomics=atomics,
        seconds=work + LAUNCH_S,
        bound=bound,
        reason=reason,
    )


def _small_reason(hw: Hardware, programs: int, rows: int, cols: int, itemsize: int) -> str | None:
    """Why fewer programs than SMs is fine: even the narrowest tiles would not make a wave, or the
    16-bit decode tiles, which were chosen by measurement (fewer programs, more bytes in flight each)."""
    if programs >= hw.units:
        return None
    most = ceil_div(rows, NARROWEST_TILE) * ceil_div(cols, NARROWEST_TILE)
    if most < hw.units:
        return f"{rows}x{cols} output: at most {most} tiles of {NARROWEST_TILE}x{NARROWEST_TILE}"
    if rows <= MEASURED_DECODE_MAX_TOKENS and itemsize == 2:
        return MEASURED_DECODE_REASON
    return None


def _matmul(hw: Hardware, launch, a: dict) -> LaunchPrediction:
    m, n, k = a["M"], a["N"], a["K"]
    bm, bn, bk, stages = a["BLOCK_M"], a["BLOCK_N"], a["BLOCK_K"], a["num_stages"]
    sa, sb, sc = a["a_ptr"].dtype.itemsize, a["b_ptr"].dtype.itemsize, a["c_ptr"].dtype.itemsize
    m_tiles, n_tiles = ceil_div(m, bm), ceil_div(n, bn)
    weight_stage, other_stage = bk * bn * sb, min(m, bm) * bk * sa
    where = occupancy(hw, launch.programs, stages * (weight_stage + bm * bk * sa), a["num_warps"])
    group = a["GROUP_M"]
    hbm = reads(k * n * sb, k * n * sb, ceil_div(m_tiles, group), hw.cache_bytes)
    hbm += reads(m * k * sa, group * bm * k * sa, n_tiles, hw.cache_bytes)
    loops = [_loop(hw, where, "K", weight_stage, other_stage, stages, hbm)]
    flops = 2 * bm * bn * ceil_div(k, bk) * bk
    tiles = f"{bm}x{bn}x{bk}/{stages}"
    return _finish(
        hw, "matmul", tiles, where, loops, m * n * sc, flops, 0, _small_reason(hw, launch.programs, m, n, sb)
    )


def _gated_expand(hw: Hardware, launch, a: dict) -> LaunchPrediction:
    m, n = a["M"], a["N"]
    ranks = {"gate": a["R_GATE"], "up": a["R_UP"]}
    bm, bn, br, brd, stages = a["BLOCK_M"], a["BLOCK_N"], a["BLOCK_R"], a["BLOCK_RD"], a["num_stages"]
    s = a["gate_v_ptr"].dtype.itemsize
    fused = a["FUSE_DOWN_SHRINK"]
    m_tiles, n_tiles, group = ceil_div(m, bm), ceil_div(n, bn), a["GROUP_M"]
    # One loop over both factors when their ranks are equal (MERGED), else one loop each.
    parts = [tuple(ranks)] if a["MERGED"] else [(name,) for name in ranks]
    where = occupancy(hw, launch.programs, stages * len(parts[0]) * (br * bn + bm * br) * s, a["num_warps"])
    loops, flops = [], 0
    for names in parts:
        hbm = 0
        for name in names:
            rank = ranks[name]
            hbm += reads(rank * n * s, rank * n * s, ceil_div(m_tiles, group), hw.cache_bytes)
            hbm += reads(m * rank * s, group * bm * rank * s, n_tiles, hw.cache_bytes)
            flops += 2 * bm * bn * ceil_div(rank, br) * br
        weight_stage, other_stage = len(names) * br * bn * s, len(names) * min(m, bm) * br * s
        loops.append(_loop(hw, where, "+".join(names), weight_stage, other_stage, stages, hbm))
    atomics, stored = 0, m * n * s
    if fused:
        r_down = a["R_DOWN"]
        hbm = reads(n * r_down * s, n * r_down * s, ceil_div(m_tiles, group), hw.cache_bytes)
        loops.append(_loop(hw, where, "down shrink", bn * brd * s, 0, a["DOWN_STAGES"], hbm))
        flops += 2 * bm * bn * ceil_div(r_down, brd) * brd
        atomics, stored = launch.programs * min(m, bm) * r_down, 0
    tiles = f"{bm}x{bn}, r {br}/{stages}" + (f", rd {brd}/{a['DOWN_STAGES']}" if fused else "")
    reason = _small_reason(hw, launch.programs, m, n, s)
    return _finish(
        hw, "gated_expand" + ("+down" if fused else ""), tiles, where, loops, stored, flops, atomics, reason
    )


def _lowrank_linear(hw: Hardware, launch, a: dict) -> LaunchPrediction:
    m, k, r, n = a["M"], a["K"], a["R"], a["N"]
    bm, bk, rp, bn, stages = a["BLOCK_M"], a["BLOCK_K"], a["RANK_PAD"], a["BLOCK_N"], a["num_stages"]
    s = a["x_ptr"].dtype.itemsize
    from svdmlp.kernels.configs import FUSED_MIN_WAVE_SHARE  # imports triton: only when predicting

    _, splits = launch.grid
    where = occupancy(hw, launch.programs, stages * (bk * rp * s + bm * bk * s), a["num_warps"])
    waves = where.waves
    shrink_hbm = reads(k * r * s, k * r * s, waves, hw.cache_bytes)
    shrink_hbm += reads(m * k * s, bm * k * s, splits, hw.cache_bytes)
    expand_hbm = reads(r * n * s, r * n * s, waves, hw.cache_bytes)
    loops = [
        _loop(hw, where, "shrink", bk * rp * s, min(m, bm) * bk * s, stages, shrink_hbm),
        _loop(hw, where, "expand", rp * bn * s, 0, stages, expand_hbm),
    ]
    tiles_per_split = ceil_div(ceil_div(n, bn), splits)
    flops = 2 * bm * ceil_div(k, bk) * bk * rp + 2 * bm * rp * bn * tiles_per_split
    reason = None
    if FUSED_MIN_WAVE_SHARE * hw.units <= launch.programs < hw.units:
        share = f"{FUSED_MIN_WAVE_SHARE:.0%}"
        reason = f"fused strip: {launch.programs} token blocks x splits, over {share} of the SMs"
    tiles = f"{bm}x{bn}x{bk}, rank {rp}, {splits} splits/{stages}"
    return _finish(hw, "lowrank_linear", tiles, where, loops, m * n * s, flops, 0, reason)


def _library(hw: Hardware, launch) -> LaunchPrediction:
    a, b, _ = launch.args
    m, k = a.shape
    n = b.shape[1]
    traffic = gemm(hw, m, k, n, b.dtype.itemsize)
    work = floor_seconds(traffic, hw.bandwidth, hw.peak_flops)
    bound = (
        "fixed"
        if LAUNCH_S > work
        else ("memory" if traffic.hbm_bytes / hw.bandwidth >= traffic.flops / hw.peak_flops else "compute")
    )
    return LaunchPrediction(
        kernel="cublas",
        tiles=f"{m}x{k} @ {k}x{n}",
        programs=0,
        waves=0,
        per_sm=0,
        loops=(),
        hbm_bytes=traffic.hbm_bytes,
        flops=traffic.flops,
        atomics=0,
        seconds=work + LAUNCH_S,
        bound=bound,
        reason="library GEMM: cuBLAS chooses its own grid",
    )


_MODELS = {
    "_matmul_kernel": _matmul,
    "_gated_expand_kernel": _gated_expand,
    "_lowrank_linear_kernel": _lowrank_linear,
}


def predict_launch(hw: Hardware, launch) -> LaunchPrediction:
    """The model of one captured launch (:class:`svdmlp.kernels.capture.Launch`)."""
    if launch.kernel is None:
        return _library(hw, launch)
    return _MODELS[launch.name](hw, launch, launch.arguments())


def _baseline_seconds(hw: Hardware, parts: list[Traffic]) -> float:
    return sum(floor_seconds(part, hw.bandwidth, hw.peak_flops) + LAUNCH_S for part in parts)


@dataclass(frozen=True)
class MLPLaunches:
    """The whole low-rank MLP at one token count: its launches, their sum, and the baselines."""

    m: int
    launches: tuple[LaunchPrediction, ...]
    seconds: dict[str, float]  # fused (the Triton backend), dense (cuBLAS), unfused (torch low-rank)
    floor_seconds: float  # the low-rank MLP's roofline floor

    @property
    def speedup(self) -> float:
        """Predicted dense time over the fused path's."""
        return self.seconds["dense"] / self.seconds["fused"]

    @property
    def backend_path(self) -> str:
        """What the backend's measured choice should find faster (svdmlp.backends.choice)."""
        return "fused" if self.seconds["fused"] <= self.seconds["unfused"] else "unfused"

    @property
    def floor_share(self) -> float:
        """The backend's share of the low-rank floor (1 = at the floor)."""
        return self.floor_seconds / self.seconds["fused"]

    def to_dict(self) -> dict:
        return {
            "m": self.m,
            "launches": [launch.to_dict() for launch in self.launches],
            "seconds": self.seconds,
            "floor_seconds": self.floor_seconds,
            "speedup": self.speedup,
            "floor_share": self.floor_share,
            "backend_path": self.backend_path,
        }


def predict_mlp(
    hw: Hardware, shape: MLPShape, ranks: MLPRanks, m: int, dtype: torch.dtype | None = None
) -> MLPLaunches:
    """Every launch of the Triton backend's gated MLP at ``m`` tokens (bf16 unless ``dtype`` says
    otherwise), and the baselines beside it."""
    import torch

    from svdmlp.kernels.capture import gated_mlp_launches  # imports triton

    dtype = torch.bfloat16 if dtype is None else dtype

    if hw.kind != "gpu":
        raise ValueError(f"the launch model covers the Triton kernels on GPUs, not {hw.name}")
    if dtype.itemsize != 2:
        raise ValueError(
            "the launch model covers 16-bit dtypes (fp32 dots run on FMA units it does not model)"
        )
    h, i, s = shape.hidden, shape.intermediate, dtype.itemsize
    captured = gated_mlp_launches(h, i, ranks.as_tuple(), m, dtype, hw.units)
    launches = tuple(predict_launch(hw, launch) for launch in captured)
    seconds = {
        "fused": sum(launch.seconds for launch in launches),
        "dense": _baseline_seconds(hw, dense_mlp_parts(hw, m, h, i, s)),
        "unfused": _baseline_seconds(hw, torch_unfused_mlp_parts(hw, m, h, i, ranks, s)),
    }
    floor = floor_seconds(mlp_ideal(m, h, i, ranks.as_tuple(), s), hw.bandwidth, hw.peak_flops)
    return MLPLaunches(m, launches, seconds, floor)


def rule_problems(hw: Hardware, row: MLPLaunches) -> list[str]:
    """Where a row breaks the launch rules: a Triton launch with less than one full wave of programs and
    no reason, or, at M <= 256, a weight stream with less than 32 KB in flight per SM."""
    problems = []
    for launch in row.launches:
        if launch.library:
            continue
        where = f"M={row.m} {launch.kernel} {launch.tiles}"
        if launch.programs < hw.units and launch.reason is None:
            problems.append(f"{where}: {launch.programs} programs on {hw.units} SMs")
        in_flight = launch.min_weight_in_flight()
        if row.m <= IN_FLIGHT_MAX_TOKENS and in_flight is not None and in_flight < IN_FLIGHT_RULE_BYTES:
            problems.append(f"{where}: {in_flight / 1024:.0f} KB of weights in flight per SM")
    return problems
