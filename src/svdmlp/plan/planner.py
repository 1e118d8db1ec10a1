"""The tile planner: ranks, blocks and predicted traffic and time for every MLP kernel of a model.

A low-rank gated MLP runs as two fused kernels, as in the paper (§4.2): ``gate_up`` (x shared by
both shrinks, whose U factors are concatenated, so one strip of width ``r_gate + r_up``; SiLU·mul
applied before the store) and ``down``. For each kernel and token count the planner chooses blocks
(:mod:`svdmlp.plan.tiles`), predicts the traffic of the three low-rank schedules (round trip, naive
fusion, cached strip; :mod:`svdmlp.plan.cost`) and picks the fastest. The whole MLP is compared
against the dense MLP (gate+up as one GEMM, SiLU, mul, down) and the unfused PyTorch path.

Time model: a launch takes ``max(bytes / bandwidth, FLOPs / peak)``, both ceilings scaled by the
fraction of the machine its grid occupies (a grid of 8 programs on 132 SMs pulls 8/132 of the
bandwidth). cuBLAS is assumed to fill the machine. Launch overheads are not modelled; the launch
counts are reported beside the times.
"""

from __future__ import annotations

from dataclasses import dataclass

from svdmlp.plan.cost import (
    Traffic,
    arithmetic_intensity,
    ceil_div,
    dense,
    elementwise,
    floor_seconds,
    fused,
    mlp_ideal,
    round_trip,
    weight_passes,
)
from svdmlp.plan.hardware import Hardware
from svdmlp.plan.shapes import MLPShape
from svdmlp.plan.tiles import Blocks, choose_blocks
from svdmlp.ranks import achieved_keep, uniform_ranks

# Rows of x that one sweep of a library GEMM covers before it reads the weight again: cuBLAS-style
# grouped rasterization runs 8 row tiles of 128 against each weight tile while it sits in L2 (the
# GROUP_SIZE_M = 8 of Triton's matmul tutorial), and the paper's NKI baseline blocks 8 token tiles
# of 128 (TILES_IN_BLOCK_M = 8, paper.md §4.4). Either way: 1024 rows per sweep.
GEMM_ROWS_PER_SWEEP = 1024

SCHEDULES = ("round_trip", "naive", "strip")


@dataclass(frozen=True)
class MLPRanks:
    """Ranks of the three projections and the keep they achieve."""

    gate: int
    up: int
    down: int
    keep: dict[str, float]

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.gate, self.up, self.down)

    def to_dict(self) -> dict:
        return {"gate": self.gate, "up": self.up, "down": self.down, "achieved_keep": self.keep}


def mlp_ranks(shape: MLPShape, keep: float, align: int) -> MLPRanks:
    """The rank rule's ranks for gate, up (hidden → inter) and down (inter → hidden), and the keep
    each and the whole MLP achieve."""
    h, i = shape.hidden, shape.intermediate
    shapes = {"gate": (h, i), "up": (h, i), "down": (i, h)}
    ranks = uniform_ranks(shapes, keep, align)
    achieved = {name: achieved_keep([(*shapes[name], ranks[name])]) for name in shapes}
    achieved["total"] = achieved_keep((*shapes[name], ranks[name]) for name in shapes)
    return MLPRanks(gate=ranks["gate"], up=ranks["up"], down=ranks["down"], keep=achieved)


@dataclass(frozen=True)
class KernelPlan:
    """One fused kernel ``(m × k)·(k × r)·(r × n)`` at one token count: blocks, schedules, choice."""

    name: str
    m: int
    k: int
    n: int
    rank: int
    blocks: Blocks
    splits: int
    intensity: float
    traffic: dict[str, Traffic]
    seconds: dict[str, float]
    best: str

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "m": self.m,
            "k": self.k,
            "n": self.n,
            "rank": self.rank,
            "blocks": self.blocks.to_dict(),
            "splits": self.splits,
            "intensity": self.intensity,
            "schedules": {
                key: {**self.traffic[key].to_dict(), "seconds": self.seconds[key]} for key in self.traffic
            },
            "best": self.best,
        }


@dataclass(frozen=True)
class MLPRow:
    """The whole MLP at one token count: per-kernel plans, dense vs low-rank traffic, time, floors."""

    m: int
    kernels: tuple[KernelPlan, KernelPlan]
    traffic: dict[str, Traffic]  # dense, torch_unfused, fused
    seconds: dict[str, float]
    floor_seconds: dict[str, float]  # dense, lowrank

    @property
    def floor_speedup(self) -> float:
        return self.floor_seconds["dense"] / self.floor_seconds["lowrank"]

    @property
    def predicted_speedup(self) -> float:
        return self.seconds["dense"] / self.seconds["fused"]

    def to_dict(self) -> dict:
        return {
            "m": self.m,
            "kernels": [kernel.to_dict() for kernel in self.kernels],
            "schedules": {
                key: {**self.traffic[key].to_dict(), "seconds": self.seconds[key]} for key in self.traffic
            },
            "floor_seconds": self.floor_seconds,
            "floor_speedup": self.floor_speedup,
            "predicted_speedup": self.predicted_speedup,
        }


@dataclass(frozen=True)
class ModelPlan:
    shape: MLPShape
    keep: float
    align: int
    ranks: MLPRanks
    rows: tuple[MLPRow, ...]

    def to_dict(self) -> dict:
        return {
            "model": self.shape.to_dict(),
            "keep": self.keep,
            "align": self.align,
            "ranks": self.ranks.to_dict(),
            "rows": [row.to_dict() for row in self.rows],
        }


def launch_seconds(traffic: Traffic, hw: Hardware, programs: int | None = None) -> float:
    """Predicted time of one schedule: roofline time at the share of the machine its grid fills."""
    share = 1.0 if programs is None else min(1.0, programs / hw.units)
    return floor_seconds(traffic, hw.bandwidth * share, hw.peak_flops * share)


def gemm(hw: Hardware, m: int, k: int, n: int, s: int) -> Traffic:
    """A library GEMM, its weight re-read once per sweep of rows unless the cache holds it."""
    passes = weight_passes(k * n * s, ceil_div(m, GEMM_ROWS_PER_SWEEP), hw.cache_bytes)
    return dense(m, k, n, s, passes)


def _fused_traffic(hw: Hardware, m: int, k: int, n: int, r: int, s: int, bm: int, splits: int) -> Traffic:
    token_blocks = ceil_div(m, bm)
    # Programs that share a token block run side by side; the weights are re-read once per wave of
    # token blocks (a Trainium core runs one program at a time: one pass per token block).
    waves = ceil_div(token_blocks, max(1, hw.units // splits))
    return fused(
        m,
        k,
        n,
        r,
        s,
        bm,
        splits,
        x_passes=weight_passes(m * k * s, splits, hw.cache_bytes),
        u_passes=weight_passes(k * r * s, waves, hw.cache_bytes),
        v_passes=weight_passes(r * n * s, waves, hw.cache_bytes),
    )


def _split_candidates(hw: Hardware, column_blocks: int) -> list[int]:
    if hw.kind == "trainium":
        return [1]  # the paper's kernel: one program per token block
    splits, candidates = 1, []
    while splits < column_blocks:
        candidates.append(splits)
        splits *= 2
    return candidates + [column_blocks]


def plan_kernel(hw: Hardware, name: str, m: int, k: int, n: int, r: int, s: int = 2) -> KernelPlan:
    """Blocks, the three low-rank schedules' traffic and time, and the fastest, for one kernel."""
    blocks = choose_blocks(hw, m, k, n, r, s)
    token_blocks = ceil_div(m, blocks.bm)
    column_blocks = ceil_div(n, blocks.bn)
    u_passes = weight_passes(k * r * s, ceil_div(m, GEMM_ROWS_PER_SWEEP), hw.cache_bytes)
    v_passes = weight_passes(r * n * s, ceil_div(m, GEMM_ROWS_PER_SWEEP), hw.cache_bytes)
    traffic = {"round_trip": round_trip(m, k, n, r, s, u_passes, v_passes)}
    seconds = {"round_trip": launch_seconds(traffic["round_trip"], hw)}

    naive = _fused_traffic(hw, m, k, n, r, s, blocks.bm, column_blocks)
    traffic["naive"] = naive
    seconds["naive"] = launch_seconds(naive, hw, token_blocks * column_blocks)

    splits = 1
    if blocks.fits:
        options = {}
        for candidate in _split_candidates(hw, column_blocks):
            option = _fused_traffic(hw, m, k, n, r, s, blocks.bm, candidate)
            options[candidate] = (launch_seconds(option, hw, token_blocks * candidate), option)
        splits = min(options, key=lambda c: (options[c][0], c))
        seconds["strip"], traffic["strip"] = options[splits]
    # Ties (all at the compute floor, or naive = strip when one output block spans n) go to the
    # schedule that fuses more.
    best = min(seconds, key=lambda name: (seconds[name], -SCHEDULES.index(name)))
    return KernelPlan(
        name=name,
        m=m,
        k=k,
        n=n,
        rank=r,
        blocks=blocks,
        splits=splits,
        intensity=arithmetic_intensity(r, blocks.bm, s),
        traffic=traffic,
        seconds=seconds,
        best=best,
    )


def dense_mlp_parts(hw: Hardware, m: int, h: int, i: int, s: int) -> list[Traffic]:
    """The launches of the dense MLP as the benchmarks run it (cuBLAS GEMMs, torch elementwise)."""
    return [
        gemm(hw, m, h, 2 * i, s),  # gate and up as one GEMM
        elementwise(m * i, m * i, s),  # SiLU of the gate half
        elementwise(2 * m * i, m * i, s),  # · up
        gemm(hw, m, i, h, s),  # down
    ]


def torch_unfused_mlp_parts(hw: Hardware, m: int, h: int, i: int, ranks: MLPRanks, s: int) -> list[Traffic]:
    """The launches of :func:`svdmlp.backends.torch_ref.lowrank_gated_mlp` (the unfused low-rank chain)."""
    return [
        gemm(hw, m, h, ranks.gate + ranks.up, s),  # x · [U_gate | U_up]
        gemm(hw, m, ranks.gate, i, s),  # · V_gate
        gemm(hw, m, ranks.up, i, s),  # · V_up
        elementwise(m * i, m * i, s),  # SiLU
        elementwise(2 * m * i, m * i, s),  # · up
        gemm(hw, m, i, ranks.down, s),  # · U_down
        gemm(hw, m, ranks.down, h, s),  # · V_down
    ]


def plan_row(hw: Hardware, shape: MLPShape, ranks: MLPRanks, m: int, s: int = 2) -> MLPRow:
    """The whole gated MLP at ``m`` tokens."""
    h, i = shape.hidden, shape.intermediate
    kernels = (
        plan_kernel(hw, "gate_up", m, h, i, ranks.gate + ranks.up, s),
        plan_kernel(hw, "down", m, i, h, ranks.down, s),
    )
    dense_parts = dense_mlp_parts(hw, m, h, i, s)
    unfused_parts = torch_unfused_mlp_parts(hw, m, h, i, ranks, s)
    traffic = {
        "dense": sum(dense_parts, Traffic(0, 0, 0)),
        "torch_unfused": sum(unfused_parts, Traffic(0, 0, 0)),
        "fused": sum((kernel.traffic[kernel.best] for kernel in kernels), Traffic(0, 0, 0)),
    }
    seconds = {
        "dense": sum(launch_seconds(part, hw) for part in dense_parts),
        "torch_unfused": sum(launch_seconds(part, hw) for part in unfused_parts),
        "fused": sum(kernel.seconds[kernel.best] for kernel in kernels),
    }
    floors = {
        "dense": floor_seconds(mlp_ideal(m, h, i, None, s), hw.bandwidth, hw.peak_flops),
        "lowrank": floor_seconds(mlp_ideal(m, h, i, ranks.as_tuple(), s), hw.bandwidth, hw.peak_flops),
    }
    return MLPRow(m=m, kernels=kernels, traffic=traffic, seconds=seconds, floor_seconds=floors)


def plan_model(
    hw: Hardware, shape: MLPShape, keep: float, align: int, tokens: tuple[int, ...], dtype_bytes: int = 2
) -> ModelPlan:
    """Plan every token count for one model's MLP at ``keep`` (ranks aligned to ``align``)."""
    if not tokens or any(m < 1 for m in tokens):
        raise ValueError(f"token counts must be positive integers, got {list(tokens)}")
    ranks = mlp_ranks(shape, keep, align)
    rows = tuple(plan_row(hw, shape, ranks, m, dtype_bytes) for m in tokens)
    return ModelPlan(shape=shape, keep=keep, align=align, ranks=ranks, rows=rows)
