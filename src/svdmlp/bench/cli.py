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
    """Add ``bench`` with its benchmarks: ``kernel`` and ``e2e``."""
    bench = subparsers.add_parser(
        "bench", help="benchmarks: fused kernels, and whole-model generation, against dense baselines"
    )
    benchmarks = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    add_kernel_parser(benchmarks)
    add_e2e_parser(benchmarks)


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


def add_e2e_parser(benchmarks: argparse._SubParsersAction) -> None:
    """Add ``e2e [MODEL] --keep 0.8,0.6 --batch 1,16 [--json PATH] [--plot PATH]`` (and run sizes)."""
    parser = benchmarks.add_parser(
        "e2e",
        help="generation speed of dense vs compressed models in the same engine, against the floor",
        description=(
            "Prefill tokens/s and decode ms/step, dense vs MLPs low-rank at each --keep, with the "
            "weight-streaming floor (weight bytes / measured bandwidth). On CUDA: a Llama-3.2-1B-shaped "
            "model with random bf16 weights, plus MODEL if given; on CPU: MODEL (default: the built-in "
            "SmolLM2-135M) in float32. Compressed variants get random factors of the right ranks."
        ),
    )
    parser.add_argument(
        "model", nargs="?", default=None, help="built-in model, .gguf file, model directory or hub id"
    )
    parser.add_argument("--keep", default="0.8,0.6", help="comma-separated keeps (default 0.8,0.6)")
    parser.add_argument("--batch", default="1,16", help="comma-separated batch sizes (default 1,16)")
    parser.add_argument(
        "--prompt-len", type=int, default=None, help="prompt tokens (default 128 CUDA, 32 CPU)"
    )
    parser.add_argument(
        "--new-tokens", type=int, default=None, help="tokens generated (default 128 CUDA, 16 CPU)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed runs per row (default 5 CUDA, 3 CPU)"
    )
    parser.add_argument(
        "--align",
        type=int,
        default=None,
        help="rank alignment (default 128 on CUDA: tensor-core tiles; 32 on CPU)",
    )
    parser.add_argument("--backend", choices=("auto", "torch", "triton"), default="auto")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate baseline")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)"
    )
    parser.add_argument("--json", type=Path, help="write every row and the header to this JSON file")
    parser.add_argument("--plot", type=Path, help="write a PNG plot of decode time per variant")
    parser.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: cuda if present"
    )
    parser.set_defaults(func=run_e2e)


def _values(text: str, kind, flag: str) -> tuple:
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{flag} expects a comma-separated list of numbers, got {text!r}") from None


def _default(value: int | None, default: int) -> int:
    return default if value is None else value


def run_e2e(args: argparse.Namespace) -> int:
    """Run the end-to-end benchmark; print the table and summary, write JSON and PNG if asked."""
    # Imported here: transformers takes seconds to import, and `bench kernel` does not need it.
    from transformers.utils import logging

    from svdmlp.bench import e2e, e2e_report

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    device = _device(args.device)
    cuda = device.type == "cuda"
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    config = e2e.E2EConfig(
        device=device,
        models=((e2e.RANDOM_MODEL,) + ((args.model,) if args.model else ())) if cuda else (args.model,),
        keeps=_values(args.keep, float, "--keep"),
        batches=_values(args.batch, int, "--batch"),
        prompt_len=_default(args.prompt_len, 128 if cuda else 32),
        new_tokens=_default(args.new_tokens, 128 if cuda else 16),
        repeats=_default(args.repeats, 5 if cuda else 3),
        dtype=torch.bfloat16 if cuda else torch.float32,
        align=_default(args.align, 128 if cuda else 32),
        backend=args.backend,
        hf_baseline=not args.no_hf,
    )
    environment = describe(device)
    print(f"bench e2e on {environment['device']['name']} ({device.type})", flush=True)
    report = {"environment": environment, **e2e.run(config, log=lambda line: print(line, flush=True))}
    print()
    print(e2e_report.format_rows(report))
    print()
    print(e2e_report.format_summary(report))
    if args.json:
        e2e_report.write_json(report, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        e2e_report.plot(report, args.plot)
        print(f"wrote {args.plot}")
    return 0
