"""``svdmlp eval``: perplexity and zero-shot accuracy of a checkpoint (and its dense base) or of a model."""

from __future__ import annotations

import argparse
import gc

from svdmlp.cli import options
from svdmlp.config import EFFORTS, CompressConfig


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "eval", help="perplexity and zero-shot accuracy of a checkpoint (and its dense base) or of a model"
    )
    p.add_argument(
        "target", nargs="?", default=None, help="checkpoint directory or model (default: built-in model)"
    )
    options.add_perplexity(
        p, "every built-in held-out domain and the report suite, unless only --dataset or --tasks are given"
    )
    options.add_tasks(p)
    p.add_argument("--no-baseline", action="store_true", help="skip the dense base model of a checkpoint")
    p.add_argument(
        "--quantize",
        default=None,
        metavar="SCHEME",
        help="quantize the MLP weights by round-to-nearest: int8 (per output channel), int4 (groups of 128), "
        "any intB (B from 2 to 8 bits, groups of 128) or intBgG (groups of G), symmetric, or with -asym a "
        "zero point per group (int3-asym); fp16 scales. A dense model is scored beside its quantized self "
        "(the baseline to compare compression with at equal bytes), a checkpoint with its factors quantized",
    )
    p.add_argument(
        "--gptq",
        action="store_true",
        help="with --quantize on a dense model: round by GPTQ instead, calibrated on --calib (by default "
        "the windows compress draws with no flag): the calibrated baseline",
    )
    p.add_argument(
        "--correction-keep",
        type=options.keep_fraction,
        default=None,
        metavar="F",
        help="with --gptq: keep each weight's rounding error's dominant directions as a low-rank bf16 "
        "term W = Q(W) + V·U, of the rank that keeps F of the weight's parameters (as --keep counts "
        "them), fitted on the same calibration windows; counted in the MLP's bytes",
    )
    options.add_factor_bits(
        p,
        "with --correction-keep: the correction's factors in bf16 (16, default) or rounded to int8 "
        "(8, one scale per output channel) or int4 (4), as compress --quantize --factor-bits stores them",
    )
    options.add_align(p)  # the correction's rank
    options.add_calibration(p, samples=EFFORTS["default"].calib_samples, what=" of --gptq")
    options.add_json(p, "every row, the protocol and the versions")
    options.add_runtime(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> options.Outcome:
    from svdmlp import checkpoint, corpora, models
    from svdmlp.compression.report import CompressionReport, count_parameters
    from svdmlp.evaluate import suite
    from svdmlp.quantize import Quantization

    if args.gptq and not args.quantize:
        raise ValueError(
            "--gptq chooses how --quantize rounds: give --quantize SCHEME (int8, int4, int3-asym, ...)"
        )
    if args.correction_keep and not args.gptq:
        raise ValueError(
            "--correction-keep is fitted on calibration windows: give it with --quantize and --gptq"
        )
    if args.factor_bits != 16 and not args.correction_keep:
        raise ValueError("--factor-bits is the width of a correction's factors: give --correction-keep")
    if args.quantize:
        from svdmlp.int_weights import scheme

        scheme(args.quantize)  # a bad name fails before the model loads
    settings = options.eval_settings(args)
    # Tasks alone ask for no perplexity: the default texts apply only when nothing else is asked for.
    sources = options.eval_sources(
        args, () if args.tasks else corpora.HELDOUT_SOURCES + corpora.UNSEEN_SOURCES
    )
    device, dtype = options.runtime(args)
    model, tokenizer, metadata = checkpoint.load_any(args.target, args.backend, dtype, device)
    texts = options.eval_texts(args, sources, tokenizer)
    rows = []
    calibration = {}
    if metadata is None:
        counts = count_parameters(model)
        rows.append(
            {
                "model": args.target or models.DEFAULT_MODEL,
                "kind": "dense",
                "params": counts,
                "achieved_keep": 1.0,
            }
        )
        rows[-1].update(suite.score(model, tokenizer, texts, settings, "dense"))
        if args.quantize:
            if args.gptq:
                from svdmlp.compression.quantized_dense import quantize_dense_mlps

                calibration_config = CompressConfig(
                    calibration=options.calibration_spec(args), align=args.align
                )
                quantization = quantize_dense_mlps(
                    model,
                    tokenizer,
                    args.quantize,
                    calibration_config,
                    correction_keep=args.correction_keep or 0.0,
                    correction_bits=args.factor_bits,
                )
            else:
                from svdmlp.quantize import quantize_mlp

                quantization = quantize_mlp(model, args.quantize)
            how = Quantization(args.quantize, args.gptq, args.correction_keep or 0.0, args.factor_bits)
            rows.append(
                {
                    "model": rows[0]["model"],
                    "kind": f"dense, MLP {how.label}",
                    "params": counts,
                    "achieved_keep": 1.0,
                    "quantization": quantization,
                    **suite.score(model, tokenizer, texts, settings, args.quantize),
                }
            )
    else:
        if not args.no_baseline:  # the baseline's model checked before any scoring, not after it
            models.check_recorded_base(metadata["base_model"])
            models.load_config(metadata["base_model"])
        report = CompressionReport.from_dict(metadata["report"])
        config = metadata["config"]
        calibration = report.calibration
        label = f"{config['method']} keep {config['keep']}"
        quantized = {}
        stored = "factors"
        if config.get("quantize"):  # the weights stored quantized (compress --quantize), nothing factorised
            stored = "MLP weights"
            correction = config.get("correction_keep") or 0.0
            how = Quantization(config["quantize"], True, correction, config.get("factor_bits", 16))
            label = f"MLP {how.label}"
            quantized = {"quantization": report.stored_quantization}
        elif report.quantization:
            quantized = {"quantization": report.stored_quantization}
            label += f", factors {report.quantization['scheme']}"
        if args.gptq:
            raise ValueError(
                "--gptq rounds a dense model's MLP; a checkpoint's factors are stored calibrated by "
                f"svdmlp quantize {args.target} --factor-bits 8|4 --out DIR"
            )
        if args.quantize:
            if report.quantization:
                raise ValueError(
                    f"{args.target} already stores its {stored} {report.quantization['scheme']}; "
                    "--quantize applies to floating-point weights"
                )
            from svdmlp.quantize import quantize_mlp

            quantized = {"quantization": quantize_mlp(model, args.quantize)}
            label += f", MLP {args.quantize} RTN"
        rows.append(
            {
                "model": args.target,
                "kind": f"compressed ({label})",
                **report.scored_record(),
                **quantized,
                **suite.score(model, tokenizer, texts, settings, "compressed"),
            }
        )
        if not args.no_baseline:
            del model
            gc.collect()
            base, _, _ = models.load_dense(metadata["base_model"], dtype=dtype, device=device)
            dense = {
                "model": metadata["base_model"],
                "kind": "dense",
                "params": report.params_before,
                "achieved_keep": 1.0,
                **suite.score(base, tokenizer, texts, settings, "dense"),
            }
            rows.insert(0, dense)
    record = suite.provenance(settings, dtype, device, rows[-1]["bos"])
    print(record["protocol"])
    print(eval_table(rows, [name for name, _ in texts], list(settings.tasks)))
    if calibration:
        print(calibration_line(calibration))
    failed = suite.failures(rows)
    for line in failed:
        print(line)
    summary = {**record, "rows": rows, "calibration": calibration, "failed": failed}
    if texts:
        summary.update(perplexity=rows[-1]["perplexity"][texts[0][0]], text=texts[0][0])
    if len(rows) == 2 and texts:
        summary["ratio_to_dense"] = suite.ratios_to_dense(rows[0]["perplexity"], rows[1]["perplexity"])
    return options.Outcome(1 if failed else 0, summary)


def calibration_line(calibration: dict) -> str:
    """What the checkpoint was calibrated on: its sources (weights) and the hash of the tokens."""
    sources = calibration.get("sources")
    named = ", ".join(f"{name} {weight:.2f}" for name, weight in sources) if sources else "not recorded"
    digest = calibration.get("sha256")
    return f"calibrated on {calibration.get('tokens', '?')} tokens of: {named}" + (
        f" (token SHA-256 {digest[:16]}…)" if digest else ""
    )


def _mlp_megabytes(row: dict) -> str:
    """The MLP's megabytes as stored (:func:`svdmlp.compression.report.mlp_bytes`), if known."""
    from svdmlp.compression.report import mlp_bytes

    size = mlp_bytes(row["params"]["mlp"], row.get("quantization"))
    return "" if size is None else f"{size / 1e6:.1f}"


def eval_table(rows: list[dict], text_names: list[str], task_names: list[str] = ()) -> str:
    """One row per model: parameters, perplexity per text, acc and acc_norm per task, then deltas."""
    from svdmlp.evaluate import harness
    from svdmlp.tables import format_table

    headers = ["model", "params", "MLP params", "MLP keep", "MLP MB", "compress s"]
    headers += [f"PPL {n}" for n in text_names]
    headers += [f"{task} {metric}" for task in task_names for metric in harness.METRICS]
    body = []
    for row in rows:
        cells = [row["kind"], row["params"]["total"], row["params"]["mlp"], row["achieved_keep"]]
        cells.append(_mlp_megabytes(row))
        seconds = row.get("compress_seconds")
        cells.append("" if seconds is None else round(seconds, 1))
        cells += [row["perplexity"][name] for name in text_names]
        cells += [_accuracy(row, task, metric) for task in task_names for metric in harness.METRICS]
        body.append(cells)
    table = format_table(headers, body)
    if len(rows) == 2 and text_names:
        from svdmlp.evaluate import suite

        summary = suite.ratios_to_dense(rows[0]["perplexity"], rows[1]["perplexity"])
        ratios = ", ".join(f"{n} x{r:.2f}" for n, r in summary["ratios"].items())
        which = "quantized" if rows[1]["kind"].startswith("dense") else "compressed"
        table += f"\n{which} / dense perplexity: {ratios}"
        if len(text_names) > 1:
            table += f"\n{suite.means_line(summary)}"
    if len(rows) == 2 and task_names:
        deltas = [
            f"{task} {metric} {after - before:+.4f}"
            for task in task_names
            for metric in harness.METRICS
            if isinstance(before := _accuracy(rows[0], task, metric), float)
            and isinstance(after := _accuracy(rows[1], task, metric), float)
        ]
        table += f"\ncompressed - dense accuracy: {', '.join(deltas) or 'none (tasks failed)'}"
    return table


def _accuracy(row: dict, task: str, metric: str) -> float | str:
    result = row["tasks"][task]
    if result["error"]:
        return "failed"
    return result["metrics"].get(metric, "-")
