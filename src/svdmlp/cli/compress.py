"""``svdmlp compress``: factorise a model's MLPs and save a checkpoint."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from svdmlp.cli import options
from svdmlp.config import EFFORTS, FACTOR_BITS, HEALS, METHODS, CalibrationSpec, CompressConfig


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("compress", help="factorise a model's MLPs and save a checkpoint")
    p.add_argument("model", nargs="?", default=None, help=options.MODEL_HELP)
    p.add_argument(
        "--keep", type=float, default=0.8, help="fraction of MLP parameters kept, in (0, 1] (default 0.8)"
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
        "(default: as --effort says)",
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
    p.add_argument(
        "--factor-bits",
        type=int,
        choices=sorted(FACTOR_BITS, reverse=True),
        default=16,
        help="store the factors quantized after healing: 8 (int8, one scale per output channel) or 4 "
        "(int4, one per 128 inputs), scales in fp16; 16 (default) keeps them in --save-dtype. Quantized "
        "factors run on the PyTorch backend (int8: torch's int8 weight-only kernel on CPU)",
    )
    p.add_argument(
        "--save-dtype",
        choices=options.DTYPES,
        default="bfloat16",
        help="dtype of the saved weights (default bfloat16)",
    )
    p.add_argument(
        "--max-memory",
        type=float,
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
    """The config of the flags given, every other recipe option and budget from ``--effort`` (the
    calibration windows also from the MLP's intermediate width ``inter``).

    Plain SVD collects no calibration, so with ``--method svd`` the effort's sequential calibration and
    closed-form healing (which need it) do not apply; options given explicitly always do.
    """
    effort = EFFORTS[args.effort]
    method = effort.method if args.method is None else args.method
    calibrated = method != "svd"
    heal = args.heal
    if heal is None:
        heal = effort.heal if calibrated else ("lora" if "lora" in effort.heal.split("+") else "none")
    allocate = args.allocate if args.allocate is not None else effort.allocation == "budget"
    sequential = args.sequential if args.sequential is not None else effort.sequential and calibrated
    samples = options.calibration_windows(args, effort, inter)
    steps = effort.heal_steps if args.heal_steps is None else args.heal_steps
    return CompressConfig(
        keep=args.keep,
        align=args.align,
        method=method,
        calibration=CalibrationSpec(args.calib, samples, args.calib_seq_len),
        seed=args.seed,
        targets=args.targets,
        layers=args.layers,
        allocation="budget" if allocate else "uniform",
        sequential=sequential,
        heal=heal,
        lora=options.lora_spec(args, steps),
        factor_bits=args.factor_bits,
    )


def _free_disk(path: Path) -> int:
    """Bytes free on the file system that ``path`` (or, not made yet, its nearest existing parent) is on."""
    path = path.expanduser().resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _check_footprint(args: argparse.Namespace, compress_config, shapes, journal=None):
    """Print the predicted peak memory, time and scratch disk (to stderr, with the progress bars) of
    what is left to do (a stopped run's ``journal`` says what is done); refuse a plan whose peak exceeds
    ``--max-memory``, or whose scratch files (beside ``--out``) would not fit on its disk. Returns the
    prediction and whether the model is loaded whole for distillation: where that is predicted to need
    at most a quarter of the memory allowed."""
    from svdmlp.compression import footprint

    candidates = len(compress_config.layers) if compress_config.layers is not None else shapes.layers
    done = footprint.Done.of(journal) if journal is not None else footprint.Done()
    layers = done.left(candidates)
    limit = args.max_memory * footprint.GB if args.max_memory is not None else footprint.available_memory()
    rates = footprint.Rates.measure()

    def predict(resident_healing: bool):
        return footprint.predict(
            shapes,
            compress_config,
            layers,
            rates=rates,
            resident_healing=resident_healing,
            measured=done.measured,
        ).without(list(done.steps))

    resident = predict(True)
    healing = resident.memory.get("healing")
    resident_healing = healing is not None and limit is not None and healing <= limit / 4
    predicted = resident if resident_healing else predict(False)
    print(f"svdmlp: {predicted.line()}", file=sys.stderr, flush=True)
    thin = footprint.thin_calibration(shapes, compress_config)
    if thin:
        print(f"svdmlp: {thin}", file=sys.stderr, flush=True)
    step, peak = predicted.peak
    if limit is not None and peak > limit:
        advice = " (pass --heal closed-form: distillation holds the whole model)" if step == "healing" else ""
        raise ValueError(
            f"the {step} step is predicted to need {peak / footprint.GB:.1f} GB, more than the "
            f"{limit / footprint.GB:.1f} GB allowed (--max-memory){advice}"
        )
    free = _free_disk(Path(args.out).parent)
    if predicted.disk > free:
        raise ValueError(
            f"the scratch files beside --out are predicted to need {predicted.disk / footprint.GB:.1f} GB "
            f"of disk, more than the {free / footprint.GB:.1f} GB free there: choose an --out on a larger disk"
        )
    return predicted, resident_healing


def _journal(args: argparse.Namespace, compress_config, out: Path, dtype):
    """The journal of this plan in the work directory beside ``--out`` (printing what a stopped run
    left done), or None for a plan that cannot continue a stopped run.
    A ValueError when the directory holds a stopped run of another plan."""
    from svdmlp.compression import journal

    if not journal.resumable(compress_config):
        return None
    plan = {"model": args.model or "", "config": compress_config.to_dict(), "dtype": str(dtype)}
    work = out.parent / f".{out.name}.work"
    found = journal.Journal(work, plan)
    if found.summary():
        verb = "the prediction is of what is left by" if args.dry_run else "continuing"
        print(f"svdmlp: {verb} the stopped run in {work}: {found.summary()} done", file=sys.stderr)
    return found


def run(args: argparse.Namespace) -> options.Outcome:
    import torch

    from svdmlp import checkpoint, models
    from svdmlp.compression import footprint, pipeline, report
    from svdmlp.runtime import peak_memory, return_freed_memory

    shapes = options.model_shapes(args.model)
    compress_config = config(args, shapes.inter)
    checkpoint.check_target(args.out, args.overwrite)  # fail before minutes of work, not after
    device, dtype = options.runtime(args)
    return_freed_memory()  # a bounded peak: freed Grams and activations go back at once
    out = Path(args.out).expanduser().resolve()
    journal = _journal(args, compress_config, out, dtype)
    continued = journal is not None and bool(journal.summary())
    predicted, resident_healing = _check_footprint(args, compress_config, shapes, journal)
    if args.dry_run:
        print(predicted.table())
        return options.Outcome(0, {"config": compress_config.to_dict(), "predicted": predicted.to_dict()})
    started = time.perf_counter()
    save_dtype = getattr(torch, args.save_dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Each compressed layer is written here as it is made (in the compute dtype, which distillation
    # trains), then into the checkpoint in --save-dtype; with a journal, kept when the run stops.
    if journal is not None:
        scratch = journal.directory
        scratch.mkdir(exist_ok=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.layers-", dir=out.parent))
    finished = False
    try:
        model, tokenizer = models.load_for_compression(args.model, dtype, device, scratch)
        done = []

        def on_step(step: str) -> None:
            done.append(step)
            line = predicted.pace_line(done, time.perf_counter() - started)
            print(f"svdmlp: {line}", file=sys.stderr, flush=True)

        result = pipeline.compress(
            model,
            tokenizer,
            compress_config,
            on_step=on_step,
            resident_healing=resident_healing,
            journal=journal,
        )
        base = args.model or models.DEFAULT_MODEL
        path = checkpoint.save(
            out, model, tokenizer, compress_config, result, base, overwrite=args.overwrite, dtype=save_dtype
        )
        finished = True
    finally:
        if finished or journal is None or not journal.summary():
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            journal.stopped()
            print(
                f"svdmlp: stopped; what is done ({journal.summary()}) is kept in {scratch}: "
                "run the same command again to continue",
                file=sys.stderr,
                flush=True,
            )
    print(report.layer_table(result))
    print()
    print(report.summary_line(result))
    for line in (report.heal_line(result), report.quantization_line(result)):
        if line:
            print(line)
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in result.timings.items())
    wall = time.perf_counter() - started
    runs = f"; {result.seconds:.1f} s with the stopped runs it continued" if continued else ""
    print(f"compress wall time {wall:.1f} s{runs} ({phases}); saved {path}")
    peaks = peak_memory(device)
    gpu = f", GPU {peaks['cuda'] / footprint.GB:.2f} GB (torch's allocator)" if "cuda" in peaks else ""
    print(
        f"peak memory {peaks['host'] / footprint.GB:.2f} GB (predicted {predicted.peak[1] / footprint.GB:.1f}){gpu}"
    )
    record = {
        "checkpoint": str(path),
        "config": compress_config.to_dict(),
        "report": result.to_dict(),
        "predicted": predicted.to_dict(),
        "peak_memory_bytes": peaks,
    }
    return options.Outcome(0, record)
