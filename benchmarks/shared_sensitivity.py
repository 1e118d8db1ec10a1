"""Time the allocation's sensitivity measurement of several keeps: each keep on its own (what a sweep
did before session 19) against all of them in one pass (:func:`svdmlp.compression.pipeline.measure_sensitivities`),
side by side in one run on a model on disk, and check that both give the same measurements.

    python benchmarks/shared_sensitivity.py qwen2.5-coder-0.5b --layers 0,1 --keeps 0.8,0.9,0.95 \\
        --calib-samples 128 --json /tmp/shared.json

The recipe is the default's allocation (``fisher+allocate+sequential``): the output-gradient Grams are
collected first (not timed: a sweep shares them either way).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from svdmlp import models
from svdmlp.compression import pipeline
from svdmlp.compression.journal import Journal
from svdmlp.config import CalibrationSpec, CompressConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--layers", default="0,1", help="decoder layers to measure")
    parser.add_argument("--keeps", default="0.8,0.9,0.95")
    parser.add_argument("--recipe", default="fisher+allocate+sequential")
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--json", type=Path, help="write the timings and measurements here")
    args = parser.parse_args()
    base = CompressConfig(
        calibration=CalibrationSpec(num_samples=args.calib_samples),
        layers=tuple(int(i) for i in args.layers.split(",")),
    ).with_recipe(args.recipe)
    configs = [replace(base, keep=float(k)) for k in args.keeps.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model, tokenizer = models.load_for_compression(args.model, torch.float32, "cpu", scratch)
        (scratch / "grams").mkdir()
        calibration = None
        if base.needs_output_grams:
            calibration = pipeline.collect_calibration(model, tokenizer, base, spill=scratch / "grams")

        def measure(name: str, group: list[CompressConfig]) -> tuple[float, list[Journal]]:
            journals = [Journal(scratch / f"{name}-{c.keep:g}", {"keep": c.keep}) for c in group]
            started = time.perf_counter()
            pipeline.measure_sensitivities(model, tokenizer, group, journals, calibration)
            return time.perf_counter() - started, journals

        alone = [measure("alone", [config]) for config in configs]
        shared_seconds, shared = measure("shared", configs)
        equal = all(
            a.sensitivities()[i].kl == s.sensitivities()[i].kl
            for (_, [a]), s in zip(alone, shared, strict=True)
            for i in a.sensitivities()
        )
    result = {
        "model": args.model,
        "layers": list(base.layers),
        "keeps": [c.keep for c in configs],
        "calib_samples": args.calib_samples,
        "alone_seconds": [seconds for seconds, _ in alone],
        "shared_seconds": shared_seconds,
        "speedup": sum(seconds for seconds, _ in alone) / shared_seconds,
        "equal": equal,
        "kl": {
            f"{c.keep:g}": {i: s.kl for i, s in j.sensitivities().items()}
            for c, j in zip(configs, shared, strict=True)
        },
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
