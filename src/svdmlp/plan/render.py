"""Plain-text tables of a plan: what a person reads before writing or tuning a kernel."""

from __future__ import annotations

from svdmlp.plan.hardware import KIB, MIB, Hardware
from svdmlp.plan.planner import SCHEDULES, ModelPlan
from svdmlp.tables import format_table


def describe_hardware(hw: Hardware) -> str:
    return (
        f"{hw.name}: {hw.bandwidth / 1e12:.2f} TB/s, {hw.peak_flops / 1e12:.0f} TFLOP/s bf16, "
        f"ridge {hw.ridge:.0f} FLOP/B, {hw.onchip_bytes / KIB:.0f} KiB on chip per block, "
        f"{hw.cache_bytes / MIB:.0f} MiB cache, {hw.units} unit(s)"
    )


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f}"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def kernel_table(plan: ModelPlan) -> str:
    header = ["M", "kernel", "r", "BM", "BN", "BK", "BR", "warps", "stages", "split", "on-chip KiB", "AI"]
    header += [f"MB {name}" for name in SCHEDULES] + ["best"]
    rows = []
    for row in plan.rows:
        for kernel in row.kernels:
            b = kernel.blocks
            fits = "" if b.fits else " (spills)"
            cells = [str(row.m), kernel.name, str(kernel.rank), str(b.bm), str(b.bn), str(b.bk), str(b.br)]
            cells += ["-" if b.num_warps is None else str(b.num_warps), str(b.num_stages), str(kernel.splits)]
            cells += [f"{b.onchip_bytes / KIB:.0f}{fits}", f"{kernel.intensity:.0f}"]
            cells += [
                _mb(kernel.traffic[name].hbm_bytes) if name in kernel.traffic else "-" for name in SCHEDULES
            ]
            cells.append(kernel.best)
            rows.append(cells)
    return format_table(header, rows)


def mlp_table(plan: ModelPlan) -> str:
    header = ["M", "MB dense", "MB unfused", "MB fused", "µs floor dense", "µs floor low-rank"]
    header += ["µs dense", "µs unfused", "µs fused", "launches d/u/f", "floor speedup", "predicted speedup"]
    rows = []
    for row in plan.rows:
        t, s = row.traffic, row.seconds
        rows.append(
            [
                str(row.m),
                _mb(t["dense"].hbm_bytes),
                _mb(t["torch_unfused"].hbm_bytes),
                _mb(t["fused"].hbm_bytes),
                _us(row.floor_seconds["dense"]),
                _us(row.floor_seconds["lowrank"]),
                _us(s["dense"]),
                _us(s["torch_unfused"]),
                _us(s["fused"]),
                f"{t['dense'].launches}/{t['torch_unfused'].launches}/{t['fused'].launches}",
                f"{row.floor_speedup:.2f}x",
                f"{row.predicted_speedup:.2f}x",
            ]
        )
    return format_table(header, rows)


def format_plan(plan: ModelPlan) -> str:
    """Heading, ranks, per-kernel blocks and bytes, whole-MLP bytes, floors and predicted speedups."""
    shape, ranks = plan.shape, plan.ranks
    keep = ranks.keep
    heading = (
        f"{shape.name}: hidden {shape.hidden}, intermediate {shape.intermediate}, {shape.layers} layers | "
        f"keep {plan.keep:g}, align {plan.align}\n"
        f"ranks: gate {ranks.gate}, up {ranks.up}, down {ranks.down} | achieved keep: "
        f"gate {keep['gate']:.3f}, up {keep['up']:.3f}, down {keep['down']:.3f}, MLP {keep['total']:.3f}"
    )
    return (
        f"{heading}\n\nFused kernels (one per row; bytes are HBM traffic of each schedule):\n"
        f"{kernel_table(plan)}\n\nWhole MLP, one layer (dense | PyTorch unfused low-rank | planned fused):\n"
        f"{mlp_table(plan)}"
    )
