"""``svdmlp quantize``: a compressed checkpoint's factors stored int8 or int4, without compressing again."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from svdmlp.cli import options
from svdmlp.config import FACTOR_BITS


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "quantize",
        help="store a checkpoint's factors int8 or int4 (what compress --factor-bits does, after the fact)",
        description=(
            "Quantizes the factors as `compress --factor-bits` would have: GPTQ and a closed-form refit on "
            "the calibration windows the checkpoint was compressed with (the same sources, count, length "
            "and seed), or round to nearest for a checkpoint of plain SVD. Writes a new checkpoint."
        ),
    )
    p.add_argument("checkpoint", help="an svdmlp checkpoint directory with floating-point factors")
    p.add_argument(
        "--factor-bits",
        type=int,
        choices=[bits for bits, name in FACTOR_BITS.items() if name is not None],
        required=True,
        help="8: int8, one scale per output channel; 4: int4, one per 128 inputs (scales in fp16)",
    )
    p.add_argument("--out", required=True, help="directory of the new checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it is a checkpoint")
    options.add_json(p, "the new checkpoint's path and its quantization report")
    options.add_runtime(p, dtype=False, backend=False)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> options.Outcome:
    import torch

    from svdmlp import checkpoint
    from svdmlp.compression import report
    from svdmlp.compression.steps import quantization
    from svdmlp.config import CompressConfig

    checkpoint.check_target(args.out, args.overwrite)
    metadata = checkpoint.read_metadata(args.checkpoint)
    config = CompressConfig.from_dict(metadata["config"])
    if config.factor_bits != 16:
        raise ValueError(f"{args.checkpoint} already stores its factors in {config.factor_bits} bits")
    config = replace(config, factor_bits=args.factor_bits)
    device, _ = options.runtime(args)
    started = time.perf_counter()
    model, tokenizer = checkpoint.load(args.checkpoint, backend="torch", dtype=torch.float32, device=device)
    quantization = quantization.quantize_checkpoint(model, tokenizer, config)
    result = replace(report.CompressionReport.from_dict(metadata["report"]), quantization=quantization)
    path = checkpoint.save(
        args.out,
        model,
        tokenizer,
        config,
        result,
        metadata["base_model"],
        overwrite=args.overwrite,
        dtype=getattr(torch, metadata["dtype"]),
    )
    print(report.quantization_line(result))
    print(f"quantize wall time {time.perf_counter() - started:.1f} s; saved {path}")
    return options.Outcome(0, {"checkpoint": str(path), "quantization": quantization})
