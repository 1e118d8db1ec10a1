"""What each built-in CLI command does: parse-free handlers that call the library and print."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import torch

from svdmlp import checkpoint, corpora, models, pipeline
from svdmlp.config import CalibrationSpec, CompressConfig, LoraSpec
from svdmlp.engine import Engine, Sampling
from svdmlp.engine.stream import TextStream
from svdmlp.evaluate import datasets, harness, suite
from svdmlp.report import CompressionReport, count_parameters
from svdmlp.runtime import quiet_transformers, resolve_runtime
from svdmlp.tables import format_table


def _load_target(target: str | None, args):
    """(model, tokenizer, metadata) for a checkpoint directory; metadata is None for a dense model."""
    device, dtype = resolve_runtime(args)
    quiet_transformers()
    if target is not None and checkpoint.is_checkpoint(target):
        model, tokenizer = checkpoint.load(target, backend=args.backend, dtype=dtype, device=device)
        return model, tokenizer, checkpoint.read_metadata(target)
    model, tokenizer, _ = models.load_dense(target, dtype=dtype, device=device)
    return model, tokenizer, None


def compress(args) -> int:
    config = CompressConfig(
        keep=args.keep,
        align=args.align,
        method=args.method,
        calibration=CalibrationSpec(args.calib, args.calib_samples, args.calib_seq_len),
        seed=args.seed,
        targets=args.targets,
        layers=args.layers,
        allocation="budget" if args.allocate else "uniform",
        sequential=args.sequential,
        heal=args.heal,
        lora=LoraSpec(args.heal_steps, args.heal_lr, args.heal_seq_len),
    )
    checkpoint.check_target(args.out, args.overwrite)  # fail before minutes of work, not after
    device, dtype = resolve_runtime(args)
    quiet_transformers()
    started = time.perf_counter()
    model, tokenizer, location = models.load_dense(args.model, dtype=dtype, device=device)
    report = pipeline.compress(model, tokenizer, config)
    model.to(getattr(torch, args.save_dtype))
    base = args.model or models.DEFAULT_MODEL
    path = checkpoint.save(
        args.out, model, tokenizer, config, report, base_model=base, overwrite=args.overwrite
    )
    print(layer_table(report))
    print()
    print(summary_line(report))
    healing = heal_line(report)
    if healing:
        print(healing)
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in report.timings.items())
    print(f"compress wall time {time.perf_counter() - started:.1f} s ({phases}); saved {path}")
    return 0


def layer_table(report: CompressionReport) -> str:
    """One row per layer; with allocated ranks, also why: the KL the layer alone caused at the
    reference rank, and the KL predicted at the rank it got."""
    allocated = {layer["index"]: layer for layer in report.allocation.get("layers", [])}
    rows = []
    for layer in report.layers:
        if layer.status != "compressed":
            rows.append([layer.index, f"skipped: {layer.reason}", "", "", ""] + [""] * bool(allocated))
            continue
        projections = layer.projections
        row = [
            layer.index,
            "compressed",
            "/".join(str(p.rank) for p in projections),
            "/".join(f"{p.keep:.3f}" for p in projections),
            "/".join(f"{p.error:.3f}" for p in projections),
        ]
        if allocated:
            why = allocated[layer.index]
            row.append(f"{why['kl']:.4f} at rank {why['reference_rank']} -> {why['predicted_kl']:.4f}")
        rows.append(row)
    names = "/".join(p.name for p in next((la.projections for la in report.layers if la.projections), ()))
    header = ["layer", "status", f"rank {names}", "keep", f"error ({report.error_metric})"]
    return format_table(header + ["KL alone (nats/token) -> predicted"] * bool(allocated), rows)


def heal_line(report: CompressionReport) -> str:
    """What healing changed, on the calibration data, one line per stage ("" when nothing was healed)."""
    lines = []
    pairs = [
        (p.heal_error_before, p.heal_error_after)
        for layer in report.layers
        for p in layer.projections
        if p.heal_error_before is not None
    ]
    if pairs:
        before, after = (sum(values) / len(pairs) for values in zip(*pairs, strict=True))
        lines.append(
            f"healing (closed-form): mean error of down against the dense MLP output {before:.4f} -> "
            f"{after:.4f} over {len(pairs)} matrices"
        )
    if report.healing:
        h = report.healing
        lines.append(
            f"healing (lora): {h['steps']} steps of {h['seq_len']} tokens in {h['seconds']:.1f} s; "
            f"validation KL to the dense model {h['kl_before']:.4f} -> {h['kl_after']:.4f} nats/token"
            + ("; it rose, so the factors from before healing were kept" if h.get("reverted") else "")
        )
    return "\n".join(lines)


def summary_line(report: CompressionReport) -> str:
    before, after = report.params_before, report.params_after
    return (
        f"MLP parameters {before['mlp']:,} -> {after['mlp']:,} (achieved keep {report.achieved_keep:.4f}); "
        f"model {before['total']:,} -> {after['total']:,} ({after['total'] / before['total']:.4f})"
    )


def eval_texts(args, default: tuple[str, ...] | list[str] = ()) -> list[tuple[str, str]]:
    """(name, text) to score, from the ``--text``, ``--dataset`` and ``--data-files`` of `eval` and `sweep`.

    The ``--text`` sources come first, or ``default`` when there is no ``--text`` and no ``--dataset``
    (naming a perplexity set replaces the default texts), then each ``--dataset`` set, read from its
    ``--data-files`` copy when one is given. Every name must be distinct: it keys the perplexity results.
    """
    files = _data_files(args)
    unknown = sorted(set(files) - set(args.dataset))
    if unknown:
        raise ValueError(f"--data-files given for {unknown}, which are not among --dataset {args.dataset}")
    sources = args.text or ([] if args.dataset else list(default))
    names = [*sources, *args.dataset]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{repeated} named more than once among --text and --dataset")
    texts = [(source, corpora.read_text(source)) for source in sources]
    texts += [(name, datasets.load_text(name, files.get(name))) for name in args.dataset]
    return texts


def _data_files(args) -> dict[str, str]:
    """``--data-files SET=PATH`` options as ``{SET: PATH}``."""
    files = {}
    for item in args.data_files:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--data-files expects SET=PATH, got {item!r}")
        files[name] = path
    return files


def eval_settings(args) -> suite.EvalSettings:
    """The evaluation settings of `eval` and `sweep` (both take the same options)."""
    if args.include_path is not None and not Path(args.include_path).is_dir():
        raise FileNotFoundError(f"--include-path {args.include_path} is not a directory")
    return suite.EvalSettings(
        seq_len=args.seq_len,
        max_windows=args.max_windows,
        batch_size=args.batch_size,
        tasks=args.tasks,
        include_path=args.include_path,
        limit=args.limit,
        seed=args.seed,
    )


def evaluate(args) -> int:
    settings = eval_settings(args)
    # Tasks alone ask for no perplexity: the default text applies only when nothing else is asked for.
    texts = eval_texts(args, () if args.tasks else ("shakespeare-heldout",))
    model, tokenizer, metadata = _load_target(args.target, args)
    device, dtype = resolve_runtime(args)
    rows = []
    calibration = {}
    if metadata is None:
        counts = count_parameters(model, [])
        rows.append(
            {"model": args.target or models.DEFAULT_MODEL, "kind": "dense", "params": counts["total"]}
        )
        rows[-1].update(suite.score(model, tokenizer, texts, settings, "dense"))
    else:
        report = CompressionReport.from_dict(metadata["report"])
        config = metadata["config"]
        calibration = report.calibration
        label = f"{config['method']} keep {config['keep']}"
        rows.append(
            {
                "model": args.target,
                "kind": f"compressed ({label})",
                "params": report.params_after["total"],
                "mlp_params": report.params_after["mlp"],
                "achieved_keep": report.achieved_keep,
                "compress_seconds": report.seconds,
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
                "params": report.params_before["total"],
            }
            dense.update(mlp_params=report.params_before["mlp"], achieved_keep=1.0)
            dense.update(suite.score(base, tokenizer, texts, settings, "dense"))
            rows.insert(0, dense)
    record = suite.provenance(settings, dtype, device)
    print(record["protocol"])
    print(eval_table(rows, [name for name, _ in texts], list(settings.tasks)))
    failed = suite.failures(rows)
    for line in failed:
        print(line)
    summary = {**record, "rows": rows, "calibration": calibration, "failed": failed}
    if texts:
        summary.update(perplexity=rows[-1]["perplexity"][texts[0][0]], text=texts[0][0])
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 1 if failed else 0


def eval_table(rows: list[dict], text_names: list[str], task_names: list[str] = ()) -> str:
    """One row per model: parameters, perplexity per text, acc and acc_norm per task, then deltas."""
    headers = ["model", "params", "MLP params", "MLP keep", "compress s"] + [f"PPL {n}" for n in text_names]
    headers += [f"{task} {metric}" for task in task_names for metric in harness.METRICS]
    body = []
    for row in rows:
        cells = [row["kind"], row["params"], row.get("mlp_params", ""), row.get("achieved_keep", "")]
        seconds = row.get("compress_seconds")
        cells.append("" if seconds is None else round(seconds, 1))
        cells += [row["perplexity"][name] for name in text_names]
        cells += [_accuracy(row, task, metric) for task in task_names for metric in harness.METRICS]
        body.append(cells)
    table = format_table(headers, body)
    if len(rows) == 2 and text_names:
        ratios = ", ".join(
            f"{n} x{rows[1]['perplexity'][n] / rows[0]['perplexity'][n]:.2f}" for n in text_names
        )
        table += f"\ncompressed / dense perplexity: {ratios}"
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


def generate(args) -> int:
    """Continue one prompt, streaming tokens as they come (``--engine hf``: Hugging Face ``generate``)."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    model, tokenizer, _ = _load_target(args.target, args)
    prompt = _prompt_ids(tokenizer, args)
    stream = TextStream(tokenizer, lambda text: print(text, end="", flush=True))
    if args.engine == "hf":
        stream.push(_hf_generate(model, prompt, sampling, args.max_new_tokens, tokenizer.eos_token_id))
    else:
        engine = Engine(model, max_batch=1)
        engine.generate(
            [prompt],
            args.max_new_tokens,
            sampling,
            stop_tokens=_stop_tokens(model, tokenizer),
            on_tokens=lambda new: stream.push(new[0]),
        )
    stream.close()
    print()
    return 0


def _prompt_ids(tokenizer, args) -> list[int]:
    if not args.chat:
        return tokenizer(args.prompt)["input_ids"]
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; drop --chat")
    messages = [{"role": "user", "content": args.prompt}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return list(encoded["input_ids"])


def _stop_tokens(model, tokenizer) -> set[int]:
    """The tokenizer's end-of-sequence id and every one the model's generation config names."""
    configured = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    return {i for i in ids if i is not None}


def _hf_generate(model, prompt: list[int], sampling: Sampling, max_new_tokens: int, pad_id) -> list[int]:
    """Plain ``model.generate`` (dynamic cache, no graphs): the reference path."""
    device = next(model.parameters()).device
    torch.manual_seed(sampling.seed)
    options = {"do_sample": False}
    if not sampling.greedy:
        options = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p}
        options["top_k"] = sampling.top_k or 0  # 0: no top-k (the generation config may default to 50)
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt], device=device),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_id,
            **options,
        )
    return output[0, len(prompt) :].tolist()


def info(args) -> int:
    metadata = checkpoint.read_metadata(args.directory)
    if args.json:
        print(json.dumps(metadata, indent=2))
        return 0
    report = CompressionReport.from_dict(metadata["report"])
    config = metadata["config"]
    print(
        f"checkpoint {args.directory}: {metadata['model_type']} from {metadata['base_model']}, {metadata['dtype']}"
    )
    print(
        f"method {config['method']}, keep {config['keep']}, align {config['align']}, targets {config['targets']}, "
        f"calibration {config['calibration']} sha256 {report.calibration.get('sha256', '-')[:16]}"
    )
    print(layer_table(report))
    print()
    print(summary_line(report))
    return 0
