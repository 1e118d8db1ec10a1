"""Run a sweep: the dense model, then every (method, keep), each scored and saved as it finishes.

Each finished point is one JSON file in ``OUT/points/``, written atomically, so an interrupted sweep
resumes where it stopped and a finished one only rebuilds its report. A point file also records the
sweep's settings; resuming with other settings is an error rather than a silently mixed report.
The dense calibration Grams depend on the model, text and seed but not on keep or recipe, so they are
collected once (by the first point that still has to run and uses them) and shared by every point. A
model on disk (every local or built-in one, :mod:`svdmlp.lazy`) is compressed one layer at a time at
every point, and shares only its output-gradient Grams, kept on disk: a sweep then needs about the
memory of one compression, whatever its number of keeps.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from svdmlp import models
from svdmlp.compression import pipeline
from svdmlp.config import CompressConfig
from svdmlp.evaluate import suite


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


@dataclass(frozen=True)
class Point:
    """One model of the sweep: ``dense``, or a recipe (see :meth:`CompressConfig.with_recipe`) at a keep."""

    method: str
    keep: float = 1.0

    @property
    def name(self) -> str:
        return "dense" if self.method == "dense" else f"{self.method}-keep{self.keep:g}"


def plan(keeps: tuple[float, ...], methods: tuple[str, ...]) -> list[Point]:
    """The dense reference first, then each method over the keeps in the order given."""
    if not keeps or not methods:
        raise ValueError(f"a sweep needs at least one keep and one method, got {keeps} and {methods}")
    for keep in keeps:
        replace(CompressConfig(), keep=keep)  # the config's own checks name a bad keep
    for method in methods:
        CompressConfig().with_recipe(method)  # names a bad recipe or an impossible combination
    return [Point("dense")] + [Point(m, k) for m in dict.fromkeys(methods) for k in dict.fromkeys(keeps)]


def point_path(out: Path, point: Point) -> Path:
    """Where a sweep into ``out`` keeps ``point``'s record once it is finished (a rerun skips it)."""
    return out / "points" / f"{point.name}.json"


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
    identity = {
        "model": model_name or models.DEFAULT_MODEL,
        "texts": list(texts.names),
        "settings": settings.to_dict(),
        "compress": {k: v for k, v in base.to_dict().items() if k not in ("keep", "method")},
        "dtype": str(dtype).removeprefix("torch."),
    }
    (out / "points").mkdir(parents=True, exist_ok=True)
    # A model on disk keeps the shared output-gradient Grams here, each point's compressed layers in a
    # scratch directory of its own: memory holds about one layer whatever the number of keeps.
    shared = Path(tempfile.mkdtemp(prefix=".calibration-", dir=out))
    try:
        return _run_points(
            model_name, points, texts, settings, base, out, dtype, device, log, identity, shared
        )
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _run_points(model_name, points, texts, settings, base, out, dtype, device, log, identity, shared):
    calibration = None
    records, started, ran = [], time.perf_counter(), 0
    for number, point in enumerate(points, 1):
        path = point_path(out, point)
        if path.is_file():
            record = json.loads(path.read_text())
            _check_same_sweep(path, _relevant(record["sweep"], point), _relevant(identity, point))
            log(f"[{number}/{len(points)}] {point.name}: finished earlier, skipped")
            records.append(record)
            continue
        point_started = time.perf_counter()
        scratch = Path(tempfile.mkdtemp(prefix=f".{point.name}-", dir=shared.parent))
        try:
            model, tokenizer = models.load_for_compression(model_name, dtype, device, scratch)
            record = {
                "sweep": identity,
                "point": point.name,
                "method": point.method,
                "target_keep": point.keep,
            }
            if point.method == "dense":
                record.update(achieved_keep=1.0, compress_seconds=0.0, calibration={})
            else:
                config = replace(base.with_recipe(point.method), keep=point.keep)
                wants = pipeline.shared_calibration(model, config)
                if wants and (calibration is None or (config.needs_output_grams and not calibration.outputs)):
                    log(f"[{number}/{len(points)}] collecting calibration Grams once for every keep")
                    calibration = pipeline.collect_calibration(model, tokenizer, config, spill=shared)
                report = pipeline.compress(model, tokenizer, config, calibration=calibration)
                record.update(
                    achieved_keep=report.achieved_keep,
                    compress_seconds=report.seconds,
                    timings=report.timings,
                    calibration=report.calibration,
                    params=report.params_after,
                    healing=report.healing,  # distillation's validation KL before and after, reverted or not
                )
            record.update(suite.score(model, tokenizer, texts.of(tokenizer), settings, point.name))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        record["seconds"] = time.perf_counter() - point_started
        _write_atomic(path, record)
        records.append(record)
        ran += 1
        elapsed = time.perf_counter() - started
        left = (len(points) - number) * elapsed / ran
        ppl = ", ".join(f"{name} {value:.4g}" for name, value in record["perplexity"].items())
        log(
            f"[{number}/{len(points)}] {point.name}: keep {record['achieved_keep']:.4f}, PPL {ppl} "
            f"({record['seconds']:.0f} s; about {left / 60:.0f} min left)"
        )
    return records


def _relevant(identity: dict, point: Point) -> dict:
    """The settings a point's numbers depend on: no compression setting for the dense model, and the
    healing knobs only for a recipe that distils. A finished point is reused whenever these match, so
    a dense point serves any sweep of the same texts, and a new healing default leaves the others.
    Evaluation settings added since a point was written count at their defaults (``bos``: the
    model's convention, which is what those points were scored with for every model they ran on)."""
    identity = {**identity, "settings": {**suite.EvalSettings().to_dict(), **identity["settings"]}}
    if point.method == "dense":
        return {k: v for k, v in identity.items() if k != "compress"}
    if CompressConfig().with_recipe(point.method).heals_lora:
        return identity
    return {**identity, "compress": {k: v for k, v in identity["compress"].items() if k != "lora"}}


def _check_same_sweep(path: Path, found: dict, expected: dict) -> None:
    for key in expected:
        if found.get(key) != expected[key]:
            raise ValueError(
                f"{path} was made with other {key} ({found.get(key)!r}, now {expected[key]!r}): "
                "use another --out, or delete that file to recompute it"
            )


def _write_atomic(path: Path, record: dict) -> None:
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(staging, path)
