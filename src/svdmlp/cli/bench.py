"""``svdmlp bench kernel|launches|e2e``: the benchmarks (a group: each benchmark is a sub-subcommand)."""

from __future__ import annotations

import argparse
from pathlib import Path

from svdmlp.cli import options


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``bench`` with its benchmarks: ``kernel``, ``launches`` and ``e2e``."""
    bench = commands.add_parser(
        "bench", help="benchmarks: fused kernels, and whole-model generation, against dense baselines"
    )
    benchmarks = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    _add_kernel(benchmarks)
    _add_launches(benchmarks)
    _add_e2e(benchmarks)


def _add_kernel(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "kernel",
        help="time the fused low-rank MLP against cuBLAS dense, the unfused PyTorch path and the roofline",
        description=(
            "On CUDA: the six paper models' MLPs x M in {1..8192} x keep {0.8, 0.6} in bf16, CUDA-graph "
            "replays for M <= 128. On CPU: the PyTorch dense and unfused paths on small models in float32."
        ),
    )
    options.add_json(parser, "every row, the ceilings and the environment")
    parser.add_argument("--plot", type=Path, help="write a PNG plot of speedup vs M to this path")
    parser.add_argument("--quick", action="store_true", help="one model, two token counts, keep 0.8")
    options.add_runtime(parser, dtype=False, backend=False)
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
    parser.set_defaults(run=run_kernel)


def run_kernel(args: argparse.Namespace) -> options.Outcome:
    """Run the sweep, print the table and the per-keep summary, plot if asked.

    Exits 1 when a fused output failed its correctness check (the timings are still reported).
    """
    from svdmlp.bench import kernel, kernel_report
    from svdmlp.bench.environment import describe

    if args.budget_s <= 0:
        raise ValueError(f"--budget-s must be positive, got {args.budget_s}")
    if args.align < 1:
        raise ValueError(f"--align must be >= 1, got {args.align}")
    device, _ = options.runtime(args)
    environment = describe(device)
    versions = ", ".join(f"{name} {version}" for name, version in environment["versions"].items())
    print(f"bench kernel on {environment['device']['name']} ({device.type}); {versions}", flush=True)
    config = kernel.default_config(
        device, quick=args.quick, compile=args.compile, budget_s=args.budget_s, align=args.align
    )
    report = {"environment": environment, **kernel.run(config, log=lambda line: print(line, flush=True))}
    print()
    print(kernel_report.format_rows(report))
    if args.plot:
        kernel_report.plot(report, args.plot)
        print(f"wrote {args.plot}")
    print()
    print(kernel_report.format_summary(report))
    failures = sum(keep["check_failures"] for keep in report["summary"].values())
    return options.Outcome(1 if failures else 0, {"schema": kernel_report.SCHEMA, **report})


def _add_launches(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "launches",
        help="time each launch of the fused MLP beside the launch model's prediction of it",
        description=(
            "The first device run's diagnostic: per model and token count, one check of the fused op "
            "against float64, then device-event timings of every launch it makes (rotating weight "
            "copies past L2) beside svdmlp.plan.launches' prediction of that launch, and the whole "
            "call. bf16. On a CPU a dry run under TRITON_INTERPRET=1 with wall-clock timers."
        ),
    )
    parser.add_argument(
        "--models", default="paper", help="model name, 'paper' (the six paper models) or a model directory"
    )
    parser.add_argument(
        "--keep", type=float, default=0.8, help="fraction of MLP parameters kept (default 0.8)"
    )
    parser.add_argument(
        "--tokens",
        type=options.comma_list(int),
        action=options.Extend,
        default=(1, 16, 128, 512, 2048),
        help="token counts M (default 1,16,128,512,2048)",
    )
    parser.add_argument("--align", type=int, default=128, help="rank alignment (default 128)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per weight copy (default 20)")
    parser.add_argument(
        "--budget-s", type=float, default=180.0, help="skip rows not started within this many seconds"
    )
    parser.add_argument("--hardware", default="h200", help="the launch model's profile (default h200)")
    parser.add_argument("--jsonl", type=Path, help="append each row to this file as soon as it is measured")
    options.add_json(parser, "the configuration, compile seconds and every row")
    options.add_runtime(parser, dtype=False, backend=False)
    parser.set_defaults(run=run_launches)


def run_launches(args: argparse.Namespace) -> options.Outcome:
    """Run the per-launch benchmark; exit 1 when a fused output failed its check."""
    import json

    import torch

    from svdmlp.backends import triton_unavailable_reason
    from svdmlp.bench import launches
    from svdmlp.bench.environment import describe
    from svdmlp.plan.hardware import get_hardware
    from svdmlp.plan.shapes import resolve_shapes

    if args.repeats < 1 or args.budget_s <= 0 or args.align < 1:
        raise ValueError("--repeats, --budget-s and --align must be positive")
    device, _ = options.runtime(args)
    reason = triton_unavailable_reason(device)
    if reason is not None:
        raise ValueError(f"bench launches runs the Triton kernels: {reason}")
    from svdmlp import kernels

    config = launches.LaunchBenchConfig(
        device=device,
        models=tuple(resolve_shapes(args.models)),
        tokens=tuple(args.tokens),
        keep=args.keep,
        align=args.align,
        dtype=torch.bfloat16,
        repeats=args.repeats,
        budget_s=args.budget_s,
        hardware=get_hardware(args.hardware),
    )
    environment = describe(device)
    print(f"bench launches on {environment['device']['name']} ({device.type})", flush=True)
    stream = open(args.jsonl, "a") if args.jsonl else None  # noqa: SIM115 - closed below

    def emit(record: dict) -> None:
        if stream is not None:
            stream.write(json.dumps(record) + "\n")
            stream.flush()

    try:
        report = launches.run(
            config, kernels.lowrank_gated_mlp, emit, log=lambda line: print(line, flush=True)
        )
    finally:
        if stream is not None:
            stream.close()
    failures = sum(not row["check"]["ok"] for row in report["rows"])
    if report["skipped"]:
        skipped = ", ".join(f"{row['model']} M={row['m']}" for row in report["skipped"])
        print(f"skipped (budget): {skipped}")
    return options.Outcome(1 if failures else 0, {"environment": environment, **report})


def _add_e2e(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "e2e",
        help="generation speed of dense vs compressed models in the same engine, against the floor",
        description=(
            "Prefill tokens/s and decode ms/step, dense vs MLPs low-rank at each --keep (and quantized, "
            "--quantize), with the "
            "weight-streaming floor (weight bytes / measured bandwidth). On CUDA: a Llama-3.2-1B-shaped "
            "model with random bf16 weights, plus MODEL if given; on CPU: MODEL (default: the built-in "
            "SmolLM2-135M) in float32 (--dtype to change). Compressed variants get random factors of the right ranks."
        ),
    )
    parser.add_argument(
        "model", nargs="?", default=None, help="built-in model, .gguf file, model directory or hub id"
    )
    parser.add_argument(
        "--keep",
        type=options.comma_list(float),
        action=options.Extend,
        default=(0.8, 0.6),
        help="comma-separated keeps (default 0.8,0.6)",
    )
    parser.add_argument(
        "--batch",
        type=options.comma_list(int),
        action=options.Extend,
        default=(1, 16),
        help="comma-separated batch sizes (default 1,16)",
    )
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
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate baseline")
    parser.add_argument(
        "--price",
        type=float,
        default=None,
        metavar="USD",
        help="price of the device per hour: adds dollars per million generated tokens to each row",
    )
    options.add_compile(parser, "every engine's")
    parser.add_argument(
        "--factor-bits",
        type=options.comma_list(int),
        action=options.Extend,
        default=(16,),
        help="comma-separated factor storage per keep: 16 (float, default), 8 or 4 (quantized, "
        "svdmlp compress --factor-bits), e.g. 16,8 for both side by side",
    )
    parser.add_argument(
        "--quantize",
        type=options.comma_list(str),
        action=options.Extend,
        default=(),
        metavar="SCHEME[+KEEP],...",
        help="also the dense model with its MLP weights quantized, as users deploy it: int8 (per "
        "channel), int4 or int4-asym (groups of 128), run by torch's weight-only kernels on CPU in bf16 "
        "and (int8, int4) svdmlp's Triton kernel at decode on CUDA; +KEEP adds a random low-rank correction keeping "
        "that fraction of each weight (svdmlp eval --correction-keep), e.g. int8,int4,int4+0.05",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)"
    )
    options.add_json(parser, "every row, the ceilings and the environment")
    parser.add_argument("--plot", type=Path, help="write a PNG plot of decode time per variant")
    options.add_runtime(parser)
    parser.set_defaults(run=run_e2e)


def _default(value: int | None, default: int) -> int:
    return default if value is None else value


def run_e2e(args: argparse.Namespace) -> options.Outcome:
    """Run the end-to-end benchmark; print the table and summary, plot if asked."""
    import torch

    from svdmlp.bench import e2e, e2e_report
    from svdmlp.bench.environment import describe

    device, dtype = options.runtime(args)
    cuda = device.type == "cuda"
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    config = e2e.E2EConfig(
        device=device,
        models=((e2e.RANDOM_MODEL,) + ((args.model,) if args.model else ())) if cuda else (args.model,),
        keeps=args.keep,
        batches=args.batch,
        prompt_len=_default(args.prompt_len, 128 if cuda else 32),
        new_tokens=_default(args.new_tokens, 128 if cuda else 16),
        repeats=_default(args.repeats, 5 if cuda else 3),
        dtype=dtype,
        align=_default(args.align, 128 if cuda else 32),
        backend=args.backend,
        hf_baseline=not args.no_hf,
        price_per_hour=args.price,
        compile=options.compile_mode(args),
        factor_bits=args.factor_bits,
        quantized=args.quantize,
    )
    environment = describe(device)
    print(f"bench e2e on {environment['device']['name']} ({device.type})", flush=True)
    report = {"environment": environment, **e2e.run(config, log=lambda line: print(line, flush=True))}
    print()
    print(e2e_report.format_rows(report))
    print()
    print(e2e_report.format_summary(report))
    if args.plot:
        e2e_report.plot(report, args.plot)
        print(f"wrote {args.plot}")
    return options.Outcome(0, {"schema": e2e_report.SCHEMA, **report})
