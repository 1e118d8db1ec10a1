"""``svdmlp compress``: factorise a model's MLPs and save a checkpoint."""

from __future__ import annotations

import argparse

from svdmlp.cli import options
from svdmlp.config import (
    EFFORTS,
    HEALS,
    METHODS,
    STORED_SCHEMES,
    CalibrationSpec,
    CompressConfig,
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("compress", help="factorise a model's MLPs and save a checkpoint")
    p.add_argument("model", nargs="?", default=None, help=options.MODEL_HELP)
    p.add_argument(
        "--keep",
        type=options.keep_fraction,
        default=None,
        help="fraction of MLP parameters kept, in [0.01, 1] (default 0.8)",
    )
    p.add_argument(
        "--method",
        choices=METHODS,
        default=None,
        help="whiten: activation-aware SVD; fisher: the same, the error also weighted by the dense model's "
        "output-gradient (Fisher) Grams; svd: plain SVD (default: as --effort says)",
    )
    options.add_align(p)
    options.add_calibration(p, samples=None)
    p.add_argument("--seed", type=int, default=0, help="seeds the choice of calibration windows (default 0)")
    p.add_argument(
        "--targets",
        type=options.comma_list(),
        action=options.Extend,
        default=("gate", "up", "down"),
        help="projections to factorise",
    )
    p.add_argument(
        "--layers",
        type=options.comma_list(int),
        action=options.Extend,
        default=None,
        help="decoder layer indices (default: all)",
    )
    options.add_effort(p)
    p.add_argument(
        "--allocate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one rank per layer from measured sensitivity (the KL each layer alone causes at the rank "
        "rule's rank), within the parameter budget of --keep; --no-allocate: the rank rule everywhere "
        "(default: as --effort says). With --quantize and --correction-keep: the corrections' ranks, from "
        "the KL each layer's rounding alone causes, within the budget of --correction-keep (default: off)",
    )
    p.add_argument(
        "--sequential",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="calibrate each layer on the outputs of the already-compressed layers before it "
        "(default: as --effort says)",
    )
    p.add_argument(
        "--heal",
        choices=HEALS,
        default=None,
        help="closed-form: fit each down projection to compensate the compressed gate/up (needs "
        "--sequential); lora: train the factors to match the dense model's next-token distribution "
        "on calibration text; closed-form+lora: both (default: as --effort says)",
    )
    options.add_lora(p, steps=None)
    options.add_factor_bits(
        p,
        "store the factors quantized after healing: 8 (int8, one scale per output channel) or 4 "
        "(int4, one per 128 inputs), scales in fp16; 16 (default) keeps them in --save-dtype. Quantized "
        "factors run on the PyTorch backend (int8: torch's int8 weight-only kernel on CPU). With "
        "--quantize and --correction-keep: the correction's factors",
    )
    p.add_argument(
        "--quantize",
        choices=STORED_SCHEMES,
        default=None,
        help="instead of factorising, store every MLP weight quantized: int8 (one scale per output "
        "channel), int4 (one per 128 inputs) or int4-asym (and a zero point per 128 inputs), rounded by "
        "GPTQ on the calibration windows layer by layer; run by torch's weight-only kernels on CPU in "
        "bf16 and (int8, int4) svdmlp's Triton kernel at decode on CUDA",
    )
    p.add_argument(
        "--correction-keep",
        type=options.keep_fraction,
        default=None,
        metavar="F",
        help="with --quantize: beside each weight a low-rank correction of its rounding error keeping "
        "this fraction of its parameters (the rank rule of --keep, aligned to --align), stored in "
        "--save-dtype or as --factor-bits says (default: none)",
    )
    p.add_argument(
        "--save-dtype",
        choices=options.DTYPES,
        default="bfloat16",
        help="dtype of the saved weights (default bfloat16)",
    )
    p.add_argument(
        "--max-memory",
        type=options.positive_float,
        default=None,
        metavar="GB",
        help="refuse before any work when the predicted peak memory (the first line printed) exceeds "
        "this many GB (default: the memory this machine has available); distillation loads a model "
        "whole, which is faster, where that needs at most a quarter of it",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print each step's predicted peak memory and time, and the scratch disk, then stop: "
        "of the model only its config is read (a built-in one is still converted and cached on first "
        "use), nothing is written beside --out",
    )
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing svdmlp checkpoint at --out")
    options.add_json(p, "the compression report (config, ranks, errors, timings)")
    options.add_runtime(p)
    p.set_defaults(run=run)


def config(args: argparse.Namespace, inter: int) -> CompressConfig:
    """The config of the flags given, every other recipe option and budget from ``--effort``
    (:meth:`CompressConfig.preset`; the calibration windows also from the MLP's width ``inter``)."""
    effort = EFFORTS[args.effort]
    calibration = CalibrationSpec(
        args.calib, options.calibration_windows(args, effort, inter), args.calib_seq_len
    )
    if args.quantize is not None:
        return _quantize_config(args, calibration)
    if args.correction_keep is not None:
        raise ValueError("--correction-keep corrects quantized weights: give --quantize too")
    chosen = {"method": args.method, "heal": args.heal, "sequential": args.sequential}
    if args.allocate is not None:
        chosen["allocation"] = "budget" if args.allocate else "uniform"
    steps = effort.heal_steps if args.heal_steps is None else args.heal_steps
    return CompressConfig.preset(
        args.effort,
        keep=0.8 if args.keep is None else args.keep,
        align=args.align,
        calibration=calibration,
        seed=args.seed,
        targets=args.targets,
        layers=args.layers,
        lora=options.lora_spec(args, steps),
        factor_bits=args.factor_bits,
        **{name: value for name, value in chosen.items() if value is not None},
    )


def _quantize_config(args: argparse.Namespace, calibration: CalibrationSpec) -> CompressConfig:
    """``--quantize``: the weights rounded layer by layer on the calibration windows, nothing factorised,
    so the flags of the factorisation's recipe are refused rather than ignored."""
    recipe = {
        "--keep": args.keep,
        "--method": args.method,
        "--sequential": args.sequential,
        "--heal": args.heal,
        "--heal-steps": args.heal_steps,
        "--targets": None if tuple(args.targets) == ("gate", "up", "down") else args.targets,
        "--layers": args.layers,
    }
    given = [flag for flag, value in recipe.items() if value is not None]
    if given:
        raise ValueError(
            f"--quantize stores every MLP weight quantized, nothing factorised: {', '.join(given)} do not apply"
        )
    if args.factor_bits != 16 and not args.correction_keep:
        raise ValueError(
            "with --quantize, --factor-bits is the width of the correction's factors: give --correction-keep"
        )
    if args.allocate and not args.correction_keep:
        raise ValueError(
            "with --quantize, --allocate shares the correction's ranks out: give --correction-keep"
        )
    return CompressConfig(
        keep=1.0,
        align=args.align,
        calibration=calibration,
        seed=args.seed,
        sequential=True,
        quantize=args.quantize,
        correction_keep=args.correction_keep or 0.0,
        factor_bits=args.factor_bits,
        allocation="budget" if args.allocate else "uniform",
    )


def run(args: argparse.Namespace) -> options.Outcome:
    import torch

    from svdmlp.compress_on_disk import compress_to
    from svdmlp.compression import footprint, report

    shapes = options.model_shapes(args.model)
    compress_config = config(args, shapes.inter)
    device, dtype = options.runtime(args)
    done = compress_to(
        args.model,
        args.out,
        compress_config,
        max_memory=args.max_memory * footprint.GB if args.max_memory is not None else None,
        overwrite=args.overwrite,
        dtype=dtype,
        device=device,
        save_dtype=getattr(torch, args.save_dtype),
        dry_run=args.dry_run,
    )
    if args.dry_run:
        print(done.predicted.table())
        return options.Outcome(0, done.to_dict())
    result = done.report
    print(report.layer_table(result))
    print()
    print(report.summary_line(result))
    for line in (report.heal_line(result), report.quantization_line(result)):
        if line:
            print(line)
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in result.timings.items())
    runs = f"; {result.seconds:.1f} s with the stopped runs it continued" if done.continued else ""
    print(f"compress wall time {done.seconds:.1f} s{runs} ({phases}); saved {done.path}")
    peaks = done.peak_memory
    gpu = f", GPU {peaks['cuda'] / footprint.GB:.2f} GB (torch's allocator)" if "cuda" in peaks else ""
    predicted = done.predicted.peak[1] / footprint.GB
    print(f"peak memory {peaks['host'] / footprint.GB:.2f} GB (predicted {predicted:.1f}){gpu}")
    return options.Outcome(0, done.to_dict())
