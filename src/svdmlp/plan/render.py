"""Plain-text tables of a plan: what a person reads before writing or tuning a kernel."""

from __future__ import annotations

from svdmlp.plan.hardware import KIB, MIB, Hardware
from svdmlp.plan.launches import MLPLaunches
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


def launch_table(rows: list[MLPLaunches]) -> str:
    """One line per launch of the Triton backend: tiles, grid, occupancy, bytes in flight, time."""
    header = ["M", "kernel", "tiles", "programs", "waves", "res/SM", "KB in flight", "MB", "GFLOP"]
    header += ["µs", "bound", "why under a wave"]
    lines = []
    for row in rows:
        for launch in row.launches:
            in_flight = launch.min_weight_in_flight()
            lines.append(
                [
                    str(row.m),
                    launch.kernel,
                    launch.tiles,
                    "-" if launch.library else str(launch.programs),
                    "-" if launch.library else str(launch.waves),
                    "-" if launch.library else str(launch.per_sm),
                    "-" if in_flight is None else f"{in_flight / KIB:.0f}",
                    _mb(launch.hbm_bytes),
                    f"{launch.flops / 1e9:.2f}",
                    _us(launch.seconds),
                    launch.bound,
                    launch.reason or "",
                ]
            )
    return format_table(header, lines)


def launch_summary_table(rows: list[MLPLaunches]) -> str:
    """The whole MLP per token count: the backend's launches summed against the baselines and floor."""
    header = ["M", "µs fused", "µs unfused", "µs dense", "µs floor", "% of floor", "fused/dense", "backend"]
    lines = []
    for row in rows:
        s = row.seconds
        lines.append(
            [
                str(row.m),
                _us(s["fused"]),
                _us(s["unfused"]),
                _us(s["dense"]),
                _us(row.floor_seconds),
                f"{row.floor_share:.0%}",
                f"{row.speedup:.2f}x",
                row.backend_path,
            ]
        )
    return format_table(header, lines)
