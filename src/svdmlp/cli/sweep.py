"""``svdmlp sweep``: compress at several keeps and recipes, evaluate each, write a report with plots."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from svdmlp.cli import options
from svdmlp.config import EFFORTS, RECIPE_OPTIONS, CompressConfig


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``sweep [MODEL] --keep LIST --method LIST --out DIR`` (with eval's and compress's shared options)."""
    p = commands.add_parser(
        "sweep",
        help="compress at several keeps and methods, evaluate each, write a Markdown report with plots",
        description=(
            "Resumable: each finished point is OUT/points/NAME.json; a rerun skips it (so rerunning "
            "with --bench FILE added only rebuilds the report). A point stopped part way keeps what it "
            "did in OUT/.NAME.work and the shared Grams in OUT/.calibration: the same command continues it."
        ),
    )
    p.add_argument("model", nargs="?", default=None, help="as for compress (default: smollm2-135m)")
    p.add_argument(
        "--keep",
        type=options.comma_list(float),
        action=options.Extend,
        default=(0.95, 0.9, 0.8, 0.7, 0.6),
        metavar="KEEP[,KEEP]",
        help="target keeps (default 0.95,0.9,0.8,0.7,0.6)",
    )
    p.add_argument(
        "--method",
        type=options.comma_list(),
        action=options.Extend,
        default=None,
        metavar="RECIPE[,RECIPE]",
        help="whiten, fisher, svd, or one of them followed by +OPTION for each of "
        f"{', '.join(RECIPE_OPTIONS)} (compress's flags), e.g. whiten+sequential+closed-form+lora; "
        "every recipe runs at every keep (default: the recipe of --effort, which is what compress does "
        f"with no flag: {EFFORTS['default'].recipe})",
    )
    p.add_argument(
        "--quantize",
        type=options.comma_list(),
        action=options.Extend,
        default=(),
        metavar="SCHEME[,SCHEME]",
        help="add the dense model with its MLP weights quantized, each a point: a scheme rounded to "
        "nearest (int8 per output channel, int4 in groups of 128, any intB[gG][-asym] as eval --quantize "
        "takes), SCHEME-gptq rounded by GPTQ on the calibration windows, SCHEME-gptq+KEEP with a low-rank "
        "correction keeping KEEP of each weight (eval --correction-keep): the baselines to compare "
        "compression with at equal bytes",
    )
    p.add_argument(
        "--factor-bits",
        type=options.comma_list(int),
        action=options.Extend,
        default=(16,),
        metavar="BITS[,BITS]",
        help="the widths each recipe's factors are scored in at every keep: 16 floating point, 8 or 4 "
        "stored quantized as compress --factor-bits stores them, made from the floating-point factors "
        "(one compression per keep; default: 16)",
    )
    options.add_effort(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the compressions' predicted peak memory and time by step, then stop (nothing is "
        "written to --out)",
    )
    p.add_argument("--out", type=Path, required=True, help="folder for points, report.md and plots")
    options.add_perplexity(
        p, "every built-in held-out domain and the report suite, unless --dataset is given"
    )
    options.add_align(p)
    options.add_calibration(p, samples=None)
    p.add_argument(
        "--bench",
        type=Path,
        metavar="FILE",
        help="a `svdmlp bench e2e --json` file: the report adds decode speedup per keep next to perplexity",
    )
    options.add_lora(p, steps=None)
    options.add_tasks(p)
    options.add_json(p, "every point's record and the report's path")
    options.add_runtime(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> options.Outcome:
    from svdmlp import corpora
    from svdmlp.evaluate import suite
    from svdmlp.runtime import return_freed_memory
    from svdmlp.sweep import markdown, runner, speed
    from svdmlp.sweep.points import plan, point_path

    return_freed_memory()  # a bounded peak: freed Grams and activations go back at once
    shapes = options.model_shapes(args.model)
    args = with_effort(args, shapes.inter)
    points = plan(args.keep, args.method, args.quantize, args.factor_bits)
    bench = speed.load(args.bench) if args.bench else None  # checked before any work
    settings = options.eval_settings(args)
    base = CompressConfig(
        align=args.align,
        calibration=options.calibration_spec(args),
        seed=args.seed,
        lora=options.lora_spec(args),
    )
    # Unlike eval, tasks do not drop the default texts: a sweep's report is built around perplexity.
    names = options.eval_sources(args, corpora.HELDOUT_SOURCES + corpora.UNSEEN_SOURCES)
    device, dtype = options.runtime(args)
    print(f"sweep of {len(points)} points into {args.out}: {', '.join(p.name for p in points)}")
    left = [p for p in points if not point_path(Path(args.out), p).is_file()]
    done = runner.stopped(args.model, left, names, settings, base, Path(args.out), dtype)
    predicted = _print_footprint(shapes, left, done, base, settings, len(names))
    if args.dry_run:
        print(predicted.table() if predicted else "nothing left to compress")
        record = {"points": [p.name for p in left], "predicted": predicted.to_dict() if predicted else None}
        return options.Outcome(0, record)
    texts = runner.Texts(names, lambda tokenizer: options.eval_texts(args, names, tokenizer))
    records = runner.run_sweep(args.model, points, texts, settings, base, args.out, dtype, device)
    sources = [name for name in names if name not in args.dataset]  # names are distinct
    path = markdown.write_report(args.out, records, command_line(args, sources), bench)
    failed = suite.failures([{**r, "kind": r["point"]} for r in records])
    for line in failed:
        print(line)
    print(f"report: {path}")
    return options.Outcome(1 if failed else 0, {"report": str(path), "points": records, "failed": failed})


def _print_footprint(shapes, points, done, base: CompressConfig, settings, texts: int):
    """Print the predicted peak memory and time of the points still to run, less what stopped runs
    ``done`` of each, before any work (to stderr, as compress prints its own); return that prediction
    (None: nothing left to compress)."""
    from svdmlp.compression import footprint

    # Quantized factors are made from their floating-point point when it runs too; quantizing (and
    # rounding a dense baseline) is counted in neither memory nor time.
    compressed = [
        (p, finished)
        for p, finished in zip(points, done, strict=True)
        if p.method != "dense" and (p.factor_bits == 16 or p.floating not in points)
    ]
    if not compressed:
        return None  # nothing to compress (scoring dense and its baselines is minutes)

    configs = [replace(base.with_recipe(p.method), keep=p.keep) for p, _ in compressed]
    # Each text is scored on at most max_windows windows; without a limit its length is unknown here.
    tokens = texts * settings.max_windows * settings.seq_len if settings.max_windows else 0
    rates = footprint.Rates.measure()
    predicted = footprint.predict_sweep(
        shapes,
        configs,
        rates=rates,
        eval_tokens=tokens,
        scores=len(points),
        done=[finished for _, finished in compressed],
    )
    scored = "" if tokens else " (scoring not counted: no --max-windows)"
    if len(compressed) < sum(p.method != "dense" or p.quantize is not None for p in points):
        scored += " (quantizing not counted)"
    print(f"svdmlp: {predicted.line()}{scored}", file=sys.stderr, flush=True)
    for warning in {footprint.thin_calibration(shapes, config) for config in configs} - {None}:
        print(f"svdmlp: {warning}", file=sys.stderr, flush=True)
    return predicted


def with_effort(args: argparse.Namespace, inter: int) -> argparse.Namespace:
    """``args`` with the recipes and budgets not given taken from ``--effort``, as compress takes them
    (the calibration windows also from the MLP's intermediate width ``inter``)."""
    effort = EFFORTS[args.effort]
    resolved = argparse.Namespace(**vars(args))
    resolved.method = args.method or (effort.recipe,)
    resolved.calib_samples = options.calibration_windows(args, effort, inter)
    resolved.heal_steps = effort.heal_steps if args.heal_steps is None else args.heal_steps
    return resolved


def command_line(args, sources: list[str]) -> str:
    """The command that reproduces this sweep, every setting spelled out (for the report's head)."""
    words = ["svdmlp", "sweep", *([args.model] if args.model else [])]
    words += ["--keep", ",".join(f"{k:g}" for k in args.keep), "--method", ",".join(args.method)]
    if args.quantize:
        words += ["--quantize", ",".join(args.quantize)]
    if tuple(args.factor_bits) != (16,):
        words += ["--factor-bits", ",".join(str(bits) for bits in args.factor_bits)]
    for source in sources:
        words += ["--text", source]
    for name in args.dataset:
        words += ["--dataset", name]
    for item in args.data_files:
        words += ["--data-files", item]
    words += ["--seq-len", str(args.seq_len)]
    if args.max_windows:
        words += ["--max-windows", str(args.max_windows)]
    if args.batch_size != 1:
        words += ["--batch-size", str(args.batch_size)]
    if args.bos != "auto":
        words += ["--bos", args.bos]
    words += ["--align", str(args.align), "--calib", args.calib]
    words += ["--calib-samples", str(args.calib_samples), "--calib-seq-len", str(args.calib_seq_len)]
    if any("lora" in recipe.split("+") for recipe in args.method):
        words += ["--heal-steps", str(args.heal_steps)]
        if args.heal_lr is None:
            words += ["--heal-relative-lr", f"{args.heal_relative_lr:g}"]
        else:
            words += ["--heal-lr", f"{args.heal_lr:g}"]
        words += ["--heal-seq-len", str(args.heal_seq_len)]
    if args.tasks:
        words += ["--tasks", ",".join(args.tasks)]
        if args.include_path:
            words += ["--include-path", args.include_path]
        if args.limit:
            words += ["--limit", str(args.limit)]
    if args.bench:
        words += ["--bench", str(args.bench)]
    words += ["--seed", str(args.seed), "--out", str(args.out)]
    return shlex.join(words)
