"""``svdmlp bench ...``: argparse wiring for the benchmarks (the main CLI adds it as a subcommand).

``bench`` is a group: each benchmark is a sub-subcommand added by its own ``add_*_parser`` below, so
``bench e2e`` can sit beside ``bench kernel``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from svdmlp.bench.environment import describe
from svdmlp.bench.kernel import default_config, run_sweep
from svdmlp.bench.report import format_rows, format_summary, plot, write_json


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` with its benchmarks (now: ``kernel``)."""
    bench = subparsers.add_parser("bench", help="benchmarks: fused kernels vs dense and unfused baselines")
    benchmarks = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    add_kernel_parser(benchmarks)


def add_kernel_parser(benchmarks: argparse._SubParsersAction) -> None:
    """Add ``kernel [--json PATH] [--plot PATH] [--quick]`` (and ``--device``, ``--compile``, ...)."""
    parser = benchmarks.add_parser(
        "kernel",
        help="time the fused low-rank MLP against cuBLAS dense, the unfused PyTorch path and the roofline",
        description=(
            "On CUDA: the six paper models' MLPs x M in {1..8192} x keep {0.8, 0.6} in bf16, CUDA-graph "
            "replays for M <= 128. On CPU: the PyTorch dense and unfused paths on small models in float32."
        ),
    )
    parser.add_argument("--json", type=Path, help="write every row and the header to this JSON file")
    parser.add_argument("--plot", type=Path, help="write a PNG plot of speedup vs M to this path")
    parser.add_argument("--quick", action="store_true", help="one model, two token counts, keep 0.8")
    parser.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: cuda if present"
    )
    parser.add_argument(
        "--compile", action="store_true", help="also time torch.compile of the low-rank PyTorch path"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="skip rows not started within this many seconds (default 420)",
    )
    parser.add_argument(
        "--align", type=int, default=128, help="rank alignment (default 128: tensor-core tiles)"
    )
    parser.set_defaults(func=run_kernel)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available to PyTorch")
    return torch.device(name)


def run_kernel(args: argparse.Namespace) -> int:
    """Run the sweep, print the table and the per-keep summary, write JSON and PNG if asked.

    Returns 1 when a fused output failed its correctness check (the timings are still reported).
    """
    if args.budget_s <= 0:
        raise ValueError(f"--budget-s must be positive, got {args.budget_s}")
    if args.align < 1:
        raise ValueError(f"--align must be >= 1, got {args.align}")
    device = _device(args.device)
    environment = describe(device)
    versions = ", ".join(f"{name} {version}" for name, version in environment["versions"].items())
    print(f"bench kernel on {environment['device']['name']} ({device.type}); {versions}", flush=True)
    config = default_config(
        device, quick=args.quick, compile=args.compile, budget_s=args.budget_s, align=args.align
    )
    report = {"environment": environment, **run_sweep(config, log=lambda line: print(line, flush=True))}
    print()
    print(format_rows(report))
    if args.json:
        write_json(report, args.json)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    print()
    print(format_summary(report))
    failures = sum(keep["check_failures"] for keep in report["summary"].values())
    return 1 if failures else 0
