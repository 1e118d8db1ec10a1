"""Run a sweep: the dense model, its quantized baselines, then every (method, keep, factor bits),
each scored and saved as it finishes.

Each finished point is one JSON file in ``OUT/points/``, written atomically, so an interrupted sweep
resumes where it stopped and a finished one only rebuilds its report. A point file also records the
sweep's settings; resuming with other settings is an error rather than a silently mixed report.
The dense calibration Grams depend on the model, text and seed but not on keep or recipe, so they are
collected once (by the first point that still has to run and uses them) and shared by every point. A
model on disk (every local or built-in one, :mod:`svdmlp.lazy`) is compressed one layer at a time at
every point, and shares its output-gradient Grams and its allocations' measurements, kept on disk: a
sweep then needs about the memory of one compression, whatever its number of keeps.

On a model on disk, budget allocations (``--allocate``) of one method share their measurements across
keeps: the first point measures each layer once for itself and the next keeps, up to
:data:`~svdmlp.compression.steps.allocation.MEASURED_KEEPS` (its dense Grams, whitened decompositions and the dense
model's predictions; one probe per keep), into each keep's journal, and each point allocates from them.

A stopped sweep also continues inside the point it stopped in: on a model on disk the shared Grams
(``OUT/.calibration``) and each point's journal and compressed layers (``OUT/.NAME.work``, as
``svdmlp compress`` keeps them, :mod:`svdmlp.compression.journal`) stay until the sweep ends, so an
hour-long point stopped at its last layer redoes only that layer.

Quantized factors (``--factor-bits 8|4``) are made from the floating-point point of the same method
and keep, kept for them as a checkpoint in the sweep's scratch directory, as ``svdmlp quantize`` makes
them from a checkpoint: one compression serves every width. A sweep resumed after it ended, whose
floating-point point finished then, compresses again with the factors quantized (the same factors, as
``compress --factor-bits`` makes them).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from svdmlp import checkpoint, lazy, models, paths
from svdmlp.compression import footprint, output_grams, pipeline, workspace
from svdmlp.compression.clock import StepClock
from svdmlp.compression.journal import JOURNAL_FILE, Journal, resumable
from svdmlp.compression.quantized_dense import quantize_dense_mlps
from svdmlp.compression.report import CompressionReport, count_parameters
from svdmlp.compression.steps import allocation, quantization
from svdmlp.compression.steps import calibration as calibration_step
from svdmlp.compression.steps.context import Run
from svdmlp.config import CompressConfig
from svdmlp.evaluate import suite
from svdmlp.quantize import Quantization, quantize_mlp
from svdmlp.sweep.points import Point, check_same_sweep, point_path, relevant, sweep_identity

# Where a sweep into OUT keeps the output-gradient Grams its points share (a model on disk).
SHARED = ".calibration"


@dataclass
class Texts:
    """What every point is scored on: the names now, the texts read once, with the first tokenizer
    loaded (the built-in ``chat`` text is rendered in the model's chat template)."""

    names: list[str]
    read: Callable[[object], list[tuple[str, str]]]
    _texts: list[tuple[str, str]] | None = None

    def of(self, tokenizer) -> list[tuple[str, str]]:
        if self._texts is None:
            self._texts = self.read(tokenizer)
        return self._texts


def run_sweep(
    model_name: str | None,
    points: list[Point],
    texts: Texts,
    settings: suite.EvalSettings,
    base: CompressConfig,
    out: Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    log=print,
) -> list[dict]:
    """Compress and score every point not already in ``out/points``; return all points' records."""
    identity = sweep_identity(model_name, texts.names, settings, base, dtype)
    with workspace.exclusive(out):  # one sweep at a time writes ``out``
        return _run_sweep(model_name, points, texts, settings, base, out, dtype, device, log, identity)


def _run_sweep(model_name, points, texts, settings, base, out, dtype, device, log, identity) -> list[dict]:
    (out / "points").mkdir(parents=True, exist_ok=True)
    # A model on disk keeps the shared output-gradient Grams here, each point's compressed layers in a
    # work directory of its own: memory holds about one layer whatever the number of keeps. Both stay
    # when the sweep stops, for the next run to continue from.
    shared = out / SHARED
    shared.mkdir(exist_ok=True)
    finished = False
    try:
        records = _run_points(
            model_name, points, texts, settings, base, out, dtype, device, log, identity, shared
        )
        finished = True
        return records
    finally:
        stopped_calibration = bool(output_grams.kept(shared))
        if not finished and not (shared / JOURNAL_FILE).is_file() and not stopped_calibration:
            for path in shared.glob("*"):  # Grams of a calibration stopped before it was recorded
                if path.is_file():
                    path.unlink()
        if finished or not shared.is_dir() or not any(shared.iterdir()):
            shutil.rmtree(shared, ignore_errors=True)
        else:
            log(
                f"stopped; the work the points share is kept in {shared}: run the same command again to continue"
            )


def stopped(
    model_name: str | None,
    points: list[Point],
    names: list[str],
    settings: suite.EvalSettings,
    base: CompressConfig,
    out: Path,
    dtype: torch.dtype = torch.float32,
) -> list[footprint.Done]:
    """What a stopped sweep into ``out`` left done of each of ``points``: the shared calibration and
    each point's journal (for the first line's prediction of what is left).

    Raises:
        ValueError: ``out`` holds the stopped work of other settings.
    """
    identity = sweep_identity(model_name, names, settings, base, dtype)
    calibrated = Journal(out / SHARED, _shared_plan(identity), repair=False).calibration() is not None
    shared = ("calibration",) if calibrated else ()
    done = []
    for point in points:
        if point.method == "dense":
            done.append(footprint.Done())
            continue
        journal = Journal(_work(out, point), _point_plan(identity, _config(point, base)), repair=False)
        done.append(footprint.Done.of(journal, shared))
    return done


def _work(out: Path, point: Point) -> Path:
    """A point's compressed layers, and their journal where its compression can continue."""
    return workspace.work_directory(out / point.name)


def _point_plan(identity: dict, config: CompressConfig) -> dict:
    return workspace.plan(identity["model"], config, identity["dtype"])


def _shared_plan(identity: dict) -> dict:
    """The shared Grams depend on the calibration's settings, not on what each point does with them."""
    plan = {key: identity[key] for key in ("model", "dtype")}
    plan.update({key: identity["compress"][key] for key in ("calibration", "seed", "layers", "targets")})
    return plan


def _run_points(model_name, points, texts, settings, base, out, dtype, device, log, identity, shared):
    calibration = None
    records, started, ran = [], time.perf_counter(), 0
    for number, point in enumerate(points, 1):
        path = point_path(out, point)
        if path.is_file():
            record = json.loads(path.read_text())
            check_same_sweep(path, relevant(record["sweep"], point), relevant(identity, point))
            log(f"[{number}/{len(points)}] {point.name}: finished earlier, skipped")
            records.append(record)
            continue
        point_started = time.perf_counter()
        work = _work(out, point)
        kept = shared / point.floating.name  # the floating-point model, for the quantized factors
        journal, prefix = None, f"[{number}/{len(points)}]"
        try:
            record = {
                "sweep": identity,
                "point": point.name,
                "method": point.method,
                "target_keep": point.keep,
                "factor_bits": point.factor_bits,
                "quantize": point.quantize,
            }
            if point.factor_bits != 16 and kept.is_dir():
                model, tokenizer = checkpoint.load(kept, backend="torch", dtype=dtype, device=device)
                record.update(_quantized_factors(model, tokenizer, kept, point))
            else:
                work.mkdir(exist_ok=True)
                model, tokenizer = models.load_for_compression(model_name, dtype, device, work)
                if point.method == "dense":
                    record.update(_dense(model, tokenizer, point, base))
                else:
                    config = _config(point, base)
                    journal = _journal(model, config, identity, work, log, prefix)
                    # The point's time counts the work it does for the later ones too (their shared
                    # Grams and measurements), and, continued, its earlier runs' (its journal's).
                    clock = journal.clock if journal is not None else StepClock()
                    if calibration_step.shared(model, config):
                        clock.switch("calibration")
                        calibration = _shared_calibration(
                            model, tokenizer, config, calibration, shared, identity, log, prefix
                        )
                    if journal is not None and config.allocation == "budget" and journal.allocation() is None:
                        clock.switch("allocation")
                        later = points[number:]
                        _shared_sensitivities(
                            model, tokenizer, point, journal, later, base, out, identity, calibration
                        )
                    report = pipeline.compress(
                        model, tokenizer, config, calibration=calibration, journal=journal, clock=clock
                    )
                    record.update(report.scored_record())
                    if any(p.floating == point and not point_path(out, p).is_file() for p in points[number:]):
                        checkpoint.save(
                            kept, model, tokenizer, config, report, identity["model"], dtype=dtype
                        )
            record.update(suite.score(model, tokenizer, texts.of(tokenizer), settings, point.name))
        except BaseException:
            if journal is not None and journal.summary():
                journal.stopped()
                log(f"{prefix} {point.name}: stopped; what is done ({journal.summary()}) is kept in {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
            raise
        shutil.rmtree(work, ignore_errors=True)
        if not any(p.floating == point.floating and p.factor_bits != 16 for p in points[number:]):
            shutil.rmtree(kept, ignore_errors=True)  # no point left to quantize its factors
        record["seconds"] = time.perf_counter() - point_started
        paths.write_output(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
        records.append(record)
        ran += 1
        elapsed = time.perf_counter() - started
        left = (len(points) - number) * elapsed / ran
        ppl = ", ".join(f"{name} {value:.4g}" for name, value in record["perplexity"].items())
        log(
            f"{prefix} {point.name}: keep {record['achieved_keep']:.4f}, PPL {ppl} "
            f"({record['seconds']:.0f} s; about {left / 60:.0f} min left)"
        )
    return records


def _journal(model, config: CompressConfig, identity: dict, work: Path, log, prefix: str) -> Journal | None:
    """The journal of a point's compression in ``work``, or None for a plan that cannot continue."""
    if lazy.of(model) is None or not resumable(config):
        return None
    journal = Journal(work, _point_plan(identity, config))
    for note in journal.notes:
        log(f"{prefix} {note}")
    if journal.summary():
        log(f"{prefix} continuing from {work}: {journal.summary()} done")
    return journal


def _shared_sensitivities(
    model, tokenizer, point: Point, journal: Journal, later: list[Point], base, out, identity, calibration
) -> None:
    """Measure the sensitivities of ``point`` and of the next points of its method (its other keeps)
    in one pass, into their journals (:func:`~svdmlp.compression.steps.allocation.measure_shared`): their allocations then
    share each layer's Grams and decompositions instead of making them once per keep. A point joins
    when it has measured the same layers as ``point`` (none, or those of a pass they shared)."""
    configs, journals = [_config(point, base)], [journal]
    layers = set(journal.sensitivities())
    for other in later:
        if len(configs) == allocation.MEASURED_KEEPS:
            break
        if other.method == point.method and other.factor_bits == 16 and not point_path(out, other).is_file():
            config = _config(other, base)
            theirs = Journal(_work(out, other), _point_plan(identity, config))
            if theirs.allocation() is None and set(theirs.sensitivities()) == layers:
                configs.append(config)
                journals.append(theirs)
    if len(configs) > 1:
        recorded = [journal.sensitivities() for journal in journals]
        on_measured = [journal.measured for journal in journals]
        allocation.measure_shared(model, tokenizer, configs, recorded, on_measured, calibration)


def _shared_calibration(
    model, tokenizer, config, calibration, shared: Path, identity: dict, log, prefix: str
):
    """The calibration every point shares: ``calibration`` when it serves ``config``, else what a
    stopped sweep left in ``shared`` (a model on disk), else collected now, once for every keep."""
    journal = Journal(shared, _shared_plan(identity)) if lazy.of(model) is not None else None
    if calibration is None and journal is not None:
        calibration = journal.calibration()
    if calibration is not None and (calibration.outputs or not config.needs_output_grams):
        return calibration
    log(f"{prefix} collecting calibration Grams once for every keep")
    calibration = calibration_step.collect_shared(Run(model, tokenizer, config), spill=shared)
    if journal is not None:
        journal.calibrated(calibration)
    return calibration


def _config(point: Point, base: CompressConfig) -> CompressConfig:
    return replace(base.with_recipe(point.method), keep=point.keep, factor_bits=point.factor_bits)


def _dense(model, tokenizer, point: Point, base: CompressConfig) -> dict:
    """The dense model's record, its MLP rounded first for a baseline (GPTQ on ``base``'s calibration)."""
    record = {"achieved_keep": 1.0, "compress_seconds": 0.0, "calibration": {}}
    record["params"] = count_parameters(model)
    if point.quantize is None:
        return record
    started = time.perf_counter()
    how = Quantization.parse(point.quantize)
    if how.gptq:
        quantization = quantize_dense_mlps(
            model,
            tokenizer,
            how.scheme,
            base,
            correction_keep=how.correction_keep,
            correction_bits=how.correction_bits,
        )
        record["calibration"] = {
            "tokens": quantization["calibration_tokens"],
            "sha256": quantization["calibration_sha256"],
        }
    else:
        quantization = {**quantize_mlp(model, how.scheme), "method": "rtn"}
    return {**record, "quantization": quantization, "compress_seconds": time.perf_counter() - started}


def _quantized_factors(model, tokenizer, kept: Path, point: Point) -> dict:
    """The record of ``point`` made from the floating-point checkpoint ``kept``, its factors quantized
    as ``svdmlp quantize`` would (compress seconds: the compression's and the quantization's)."""
    metadata = checkpoint.read_metadata(kept)
    config = replace(CompressConfig.from_dict(metadata["config"]), factor_bits=point.factor_bits)
    quantized = quantization.quantize_checkpoint(model, tokenizer, config, progress=False)
    report = replace(CompressionReport.from_dict(metadata["report"]), quantization=quantized)
    record = report.scored_record()
    record["compress_seconds"] += quantized["seconds"]
    record["timings"] = {**record["timings"], "quantization": quantized["seconds"]}
    return record
