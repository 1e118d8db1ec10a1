"""Where a compression into a directory ``out`` works, and what it checks before it starts.

Beside ``out`` it keeps its work directory (``.NAME.work``: the compressed layers and spilled Grams, and
the journal of a plan that can continue, :mod:`~svdmlp.compression.journal`) and a lock file
(``.NAME.lock``) that one run at a time holds: a second run on the same ``out`` refuses at once rather
than race the first for the same files. Before any work, the predicted peak memory is checked against
the memory allowed and the predicted disk (the scratch files at their peak, then the checkpoint written
beside them) against the disk free there. ``svdmlp compress`` (:func:`svdmlp.compress_to`) and each
point of ``svdmlp sweep`` work this way.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from svdmlp import ranks
from svdmlp.compression import footprint
from svdmlp.compression.journal import Journal, resumable
from svdmlp.config import CompressConfig


def work_directory(out: Path) -> Path:
    """The work directory of a compression into ``out``."""
    return out.parent / f".{out.name}.work"


def plan(model: str, config: CompressConfig, dtype) -> dict:
    """What a stopped compression must share with the run that continues it: the model (as recorded
    in checkpoints), the config, the compute dtype."""
    return {"model": model, "config": config.to_dict(), "dtype": str(dtype).removeprefix("torch.")}


def journal(
    out: Path, plan: dict, config: CompressConfig, resume: bool = True, repair: bool = True
) -> Journal | None:
    """The journal of ``plan`` in the work directory of ``out`` (what a stopped run left done, its kept
    files checked), or None for a plan that cannot continue. ``resume=False`` starts again: a stopped
    run's work is deleted first. ``repair=False`` (a dry run) changes nothing on disk
    (:class:`~svdmlp.compression.journal.Journal`).

    Raises:
        ValueError: the work directory holds a stopped run of another plan (kept: that run's command
            finishes it).
    """
    if not resumable(config):
        return None
    directory = work_directory(out)
    if not resume and repair:
        shutil.rmtree(directory, ignore_errors=True)
    return Journal(directory, plan, repair)


@contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock for the block: one run at a time writes ``out`` and its work directory.

    Raises:
        ValueError: another run holds it (its process id in the message).
    """
    path = out.parent / f".{out.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(handle, 32).decode(errors="replace").strip() or "unknown"
            os.close(handle)
            raise ValueError(
                f"another svdmlp run (process {holder}) is writing {out}: wait for it to end, or choose "
                "another --out"
            ) from None
        try:  # the lock file the previous holder deleted as it let go: take the new one
            same = os.stat(path).st_ino == os.fstat(handle).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(handle)
    try:
        os.ftruncate(handle, 0)
        os.write(handle, str(os.getpid()).encode())
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(handle)


def free_disk(path: Path) -> int:
    """Bytes free on the file system of ``path`` (or, not made yet, of its nearest existing parent)."""
    path = path.expanduser().resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check(
    shapes: footprint.Shapes,
    config: CompressConfig,
    out: Path,
    journal: Journal | None,
    max_memory: float | None,
    save_bytes: int,
) -> tuple[footprint.Footprint, bool, list[str]]:
    """The predicted footprint of what is left to do (what ``journal`` records is done), whether the
    model is loaded whole for distillation (where that needs at most a quarter of the memory allowed),
    and the lines to print ("the first line"); a ValueError when the peak memory exceeds ``max_memory``
    bytes (None: the memory available) or the disk needed beside ``out`` (the scratch files at their
    peak and the checkpoint, ``save_bytes`` per weight) exceeds the disk free there."""
    projections = {name: (shapes.hidden, shapes.inter) for name in config.targets}
    ranks.uniform_ranks(projections, config.keep, config.align)  # an impossible rank, before anything
    candidates = len(config.layers) if config.layers is not None else shapes.layers
    done = footprint.Done.of(journal) if journal is not None else footprint.Done()
    layers = done.left(candidates)
    limit = max_memory if max_memory is not None else footprint.available_memory()
    rates = footprint.Rates.measure()

    def predict(resident_healing: bool) -> footprint.Footprint:
        return footprint.predict(
            shapes, config, layers, rates=rates, resident_healing=resident_healing, measured=done.measured
        ).without(list(done.steps))

    resident = predict(True)
    healing = resident.memory.get("healing")
    resident_healing = healing is not None and limit is not None and healing <= limit / 4
    predicted = resident if resident_healing else predict(False)
    lines = [predicted.line(), *filter(None, [footprint.thin_calibration(shapes, config)])]
    step, peak = predicted.peak
    if limit is not None and peak > limit:
        advice = " (pass --heal closed-form: distillation holds the whole model)" if step == "healing" else ""
        raise ValueError(
            f"the {step} step is predicted to need {peak / footprint.GB:.1f} GB, more than the "
            f"{limit / footprint.GB:.1f} GB allowed (--max-memory){advice}"
        )
    checkpoint = footprint.checkpoint_bytes(shapes, config, candidates, save_bytes)
    free = free_disk(out.parent)
    if predicted.disk + checkpoint > free:
        raise ValueError(
            f"the scratch files and the checkpoint beside --out are predicted to need "
            f"{(predicted.disk + checkpoint) / footprint.GB:.1f} GB of disk, more than the "
            f"{free / footprint.GB:.1f} GB free there: choose an --out on a larger disk"
        )
    return predicted, resident_healing, lines
