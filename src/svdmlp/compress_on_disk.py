"""Compress a model on disk into a checkpoint directory, in bounded memory and resumably: what
``svdmlp compress`` does, as one call from Python.

The model's layers stay on disk (:mod:`svdmlp.lazy`): memory holds about one decoder layer whatever the
model's size. The work is done beside ``out`` (:mod:`svdmlp.compression.workspace`: a work directory
that one run at a time may hold, checked against the memory and disk there before any work), and a
plan that can continue keeps a journal there (:mod:`svdmlp.compression.journal`), so that a stopped run
started again with the same arguments redoes only what it had not finished, after checking every file
it kept.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from svdmlp import checkpoint, models
from svdmlp.compression import footprint, pipeline, workspace
from svdmlp.compression.report import CompressionReport
from svdmlp.config import CompressConfig
from svdmlp.runtime import peak_memory, return_freed_memory


@dataclass
class Compressed:
    """What :func:`compress_to` did: the checkpoint (None for a dry run), its report, the predicted
    footprint it checked first, and the run's wall seconds and peak memory by device."""

    path: Path | None
    config: CompressConfig
    predicted: footprint.Footprint
    report: CompressionReport | None = None
    seconds: float = 0.0
    continued: bool = False  # it continued a stopped run (the report's seconds count that run's too)
    peak_memory: dict | None = None

    def to_dict(self) -> dict:
        record = {"config": self.config.to_dict(), "predicted": self.predicted.to_dict()}
        if self.path is not None:
            record["checkpoint"] = str(self.path)
        if self.report is not None:
            record["report"] = self.report.to_dict()
        if self.peak_memory is not None:
            record["peak_memory_bytes"] = self.peak_memory
        return record


def _stderr(line: str) -> None:
    print(f"svdmlp: {line}", file=sys.stderr, flush=True)


def compress_to(
    model: str | os.PathLike | None,
    out: str | os.PathLike,
    config: CompressConfig | None = None,
    *,
    resume: bool = True,
    max_memory: float | None = None,
    overwrite: bool = False,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    save_dtype: torch.dtype = torch.bfloat16,
    dry_run: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = _stderr,
) -> Compressed:
    """Compress ``model`` as ``config`` says and save the checkpoint to ``out``.

    Args:
        model: a local Hugging Face directory, a hub id, or a built-in name; None: the built-in default.
        config: the default recipe at keep 0.8 when None (:meth:`CompressConfig.preset`, sized for the
            model's MLP as the command line sizes it).
        resume: continue a stopped run of the same plan into ``out`` (False: start again).
        max_memory: refuse before any work when the predicted peak exceeds this many bytes (default:
            the memory available).
        overwrite: replace an svdmlp checkpoint at ``out``.
        dtype, device: what the compression computes in; ``save_dtype``: the saved weights' dtype.
        dry_run: check and predict only; nothing is written (of the model only its config is read).
        log: where the lines of the prediction and progress go (default: stderr).

    Raises:
        ValueError: an impossible plan, too little memory or disk, another run holding ``out``, a
            stopped run of another plan there; FileExistsError: ``out`` holds something else.
    """
    device = torch.device(device)
    shapes = footprint.Shapes.of_config(models.load_config(model)[1])
    if config is None:
        config = CompressConfig.preset(inter=shapes.inter)
    name = models.recorded_name(model) if model is not None else models.DEFAULT_MODEL
    checkpoint.check_target(out, overwrite)  # fail before minutes of work, not after
    out = Path(out).expanduser().resolve()
    if dry_run:
        plan = workspace.plan(name, config, dtype)
        journal = workspace.journal(out, plan, config, repair=False) if resume else None  # reads only
        if journal is not None and journal.summary():
            kept = f"{journal.directory}: {journal.summary()} done"
            log(f"the prediction is of what is left by the stopped run in {kept}")
        predicted, _, lines = workspace.check(shapes, config, out, journal, max_memory, save_dtype.itemsize)
        for line in lines:
            log(line)
        return Compressed(None, config, predicted)
    with workspace.exclusive(out):
        return _compress(
            model,
            name,
            out,
            config,
            shapes,
            resume,
            max_memory,
            overwrite,
            dtype,
            device,
            save_dtype,
            progress,
            log,
        )


def _compress(
    model, name, out, config, shapes, resume, max_memory, overwrite, dtype, device, save_dtype, progress, log
):
    return_freed_memory()  # a bounded peak: freed Grams and activations go back at once
    journal = workspace.journal(out, workspace.plan(name, config, dtype), config, resume)
    continued = journal is not None and bool(journal.summary())
    if journal is not None:
        for note in journal.notes:
            log(note)
        if continued:
            log(f"continuing the stopped run in {journal.directory}: {journal.summary()} done")
    predicted, resident_healing, lines = workspace.check(
        shapes, config, out, journal, max_memory, save_dtype.itemsize
    )
    for line in lines:
        log(line)
    started = time.perf_counter()
    # Each compressed layer is written to the scratch directory as it is made (in the compute dtype,
    # which distillation trains), then into the checkpoint in ``save_dtype``; with a journal, kept when
    # the run stops.
    out.parent.mkdir(parents=True, exist_ok=True)
    if journal is not None:
        scratch = journal.directory
        scratch.mkdir(exist_ok=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.layers-", dir=out.parent))
    finished = False
    try:
        loaded, tokenizer = models.load_for_compression(model, dtype, device, scratch)
        done = []

        def on_step(step: str) -> None:
            done.append(step)
            log(predicted.pace_line(done, time.perf_counter() - started))

        report = pipeline.compress(
            loaded,
            tokenizer,
            config,
            progress=progress,
            on_step=on_step,
            resident_healing=resident_healing,
            journal=journal,
        )
        path = checkpoint.save(
            out, loaded, tokenizer, config, report, name, overwrite=overwrite, dtype=save_dtype
        )
        finished = True
    finally:
        if finished or journal is None or not journal.summary():
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            journal.stopped()
            log(
                f"stopped; what is done ({journal.summary()}) is kept in {scratch}: run the same command again to continue"
            )
    seconds = time.perf_counter() - started
    return Compressed(path, config, predicted, report, seconds, continued, peak_memory(device))
