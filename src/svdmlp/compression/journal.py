"""A compression's progress on disk, so that a stopped run continues where it stopped.

A model on disk is compressed into a work directory: the output-gradient Grams are spilled there, and
each compressed layer is written there as it is made (:meth:`svdmlp.lazy.DiskWeights.store`). The
journal (``progress.json`` beside them, rewritten atomically) records what is done and what it found:
the calibration's tokens, each layer's measured sensitivity and then the allocated ranks, each stored
layer's record, the healing, and the seconds each step took so far (:mod:`~svdmlp.compression.clock`).
Started again with the same plan on the same directory, compression skips what the journal records: it
installs the stored layers from their files instead of compressing them again, and calibration,
allocation and healing, once recorded, are not run again. Hours of a big model's run survive a crash, an
OOM kill or the end of a session.

Every file counts as done only once it is whole on disk: written to a temporary name, synced and renamed
(:func:`svdmlp.lazy.save_atomic`, which also records a digest of its values in it), then recorded here
with that digest. A continued run checks each file it would use against its digest before trusting
it and redoes what fails (:meth:`Journal._check_files`): a kill, a full disk or a damaged file costs
the work it held, never a wrong factor.

What is redone: a step or layer the journal does not record (a stopped layer is compressed from its
start; a stopped calibration continues from the layer inputs and gradient its passes left in the
directory, :func:`svdmlp.compression.output_grams.collect_output_grams`), and distillation, which
changes the stored layers in place: it is recorded only when it ends, and the layers it had trained are
put back as they were before it (hard links made when it starts).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn as nn

from svdmlp import arch, lazy, lowrank, paths
from svdmlp.compression.calibration import Calibration
from svdmlp.compression.clock import StepClock
from svdmlp.compression.heal import distill
from svdmlp.compression.output_grams import OutputGrams, kept
from svdmlp.compression.report import LayerRecord
from svdmlp.config import CompressConfig
from svdmlp.int_weights import STORED, factor_scheme
from svdmlp.quantized_linear import install_empty
from svdmlp.ranks import LayerSensitivity, Spectrum

JOURNAL_FILE = "progress.json"


def resumable(config: CompressConfig) -> bool:
    """Whether a stopped compression of ``config`` can continue from its journal: not one-shot
    calibration (a layer compressed earlier would change the dense walk the later layers are calibrated
    on), nor quantized factors (their quantization is not recorded). Quantized weights
    (``config.quantize``) continue from their last layer stored, each with the counts of its tally."""
    if config.quantize is not None:
        return True
    return (config.sequential or not config.needs_calibration) and config.factor_bits == 16


class Journal:
    """The progress of one plan (the model, the compression config, the dtype) in ``directory``.
    Opened with ``repair=False`` (a prediction of what is left, which may run beside the run that
    writes the directory) it reads and checks, and changes nothing on disk.

    Raises:
        ValueError: the directory holds the progress of another plan, or an unreadable journal.
    """

    def __init__(self, directory: str | os.PathLike, plan: dict, repair: bool = True):
        self.directory, self.repair = Path(directory), repair
        self.path = self.directory / JOURNAL_FILE
        self.state: dict = {"plan": plan}
        if self.path.is_file():
            try:
                state = json.loads(self.path.read_text())
            except (OSError, ValueError) as err:
                raise ValueError(
                    f"{self.path} cannot be read ({err}): delete {self.directory} to start again"
                ) from None
            if state.get("plan") != plan:
                raise ValueError(
                    f"{self.directory} holds a stopped compression of another plan "
                    f"({_difference(state.get('plan', {}), plan)}): run that command again to finish "
                    f"it, or delete {self.directory} to start this one"
                )
            self.state = state
        # The steps' seconds over every run of this plan, kept with each record written.
        self.clock = StepClock(self.state.get("seconds"))
        self.notes: list[str] = []  # what the check of the kept files found and will redo, in words
        self._check_files()

    def _write(self) -> None:
        if not self.repair:
            raise ValueError("a journal opened to read (repair=False) records nothing")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.state["seconds"] = self.clock.totals()
        paths.write_output(self.path, json.dumps(self.state, indent=1))  # on disk (fsync) before it counts

    def _check_files(self) -> None:
        """Check every file the journal counts as done against the digest recorded with it (a file is
        recorded only once it is on disk) and forget what fails, after undoing a stop while distillation
        ran (its layers' files put back as they were before it). A compressed layer that fails is
        compressed again (to the same factors: from the same inputs), or every layer and the healing
        where distillation had changed them all; a calibration whose Grams fail is collected again.
        Nothing that failed a check is read. Without :attr:`repair`, the same is found and nothing
        on disk changes."""
        files = {
            int(index): self.directory / name
            for index, (name, _) in self.state.get("layer_files", {}).items()
        }
        for index, path in files.items():
            before = path.with_name(path.name + distill.BEFORE)
            if before.is_file() and self.healing() is None:
                if not self.repair:
                    files[index] = before  # what a continued run would put back
                    continue
                os.replace(before, path)
            if self.repair:
                before.unlink(missing_ok=True)
                path.with_name(path.name + distill.ADAMW).unlink(missing_ok=True)
        digests = {int(index): digest for index, (_, digest) in self.state.get("layer_files", {}).items()}
        bad = sorted(
            index
            for index in map(int, self.state.get("layers", {}))
            if index not in files or not lazy.intact(files[index], digests[index])
        )
        if bad and self.healing() is not None:
            self.notes.append(
                f"the kept file of {_layers(bad)} failed its check; distillation had changed every layer, "
                "so the layers and the healing are done again"
            )
            bad = sorted(map(int, self.state["layers"]))
            del self.state["healing"]
        elif bad:
            self.notes.append(f"the kept file of {_layers(bad)} failed its check: compressed again")
        for index in bad:
            del self.state["layers"][str(index)]
            name = self.state.get("layer_files", {}).pop(str(index), [None])[0]
            if name is not None and self.repair:
                (self.directory / name).unlink(missing_ok=True)
        calibration = self.state.get("calibration")
        failed = calibration is not None and any(
            self._needed(int(index)) and not lazy.intact(self.directory / entry["file"], entry.get("sha256"))
            for index, entry in calibration["outputs"].items()
        )
        if failed:
            self.notes.append("the calibration's output-gradient Grams failed their check: collected again")
            del self.state["calibration"]
        if (bad or failed) and self.repair:
            self._write()

    def _needed(self, index: int) -> bool:
        """Whether layer ``index``'s output-gradient Grams are still to be used: not once it is compressed,
        nor for a layer the allocation left dense."""
        allocated = self.allocation()
        return str(index) not in self.state.get("layers", {}) and (allocated is None or index in allocated[0])

    @property
    def done(self) -> list[str]:
        """The steps recorded as done (in the order they ran). The factorisation is done once every layer
        the allocation chose is stored, or once distillation, which follows it, is recorded."""
        steps = [step for step in ("calibration", "allocation") if step in self.state]
        chosen = self.chosen()
        if "healing" in self.state or (chosen is not None and len(self.state.get("layers", {})) >= chosen):
            steps.append("factorisation")
        return steps + (["healing"] if "healing" in self.state else [])

    def summary(self) -> str:
        """What a continued run will not redo, for its first lines ("" when nothing)."""
        parts = list(self.done)
        calibration = kept(self.directory) if "calibration" not in self.state else ""
        if calibration:
            parts.append(calibration)
        if self.state.get("sensitivities"):  # the allocation was stopped
            parts.append(f"{len(self.state['sensitivities'])} layers' sensitivity")
        if self.state.get("layers"):
            parts.append(f"{len(self.state['layers'])} compressed layers")
        return ", ".join(parts)

    def stopped(self) -> None:
        """Record the time of a run stopped after its last record (a continued run counts it)."""
        self.clock.switch(None)
        self._write()

    # Calibration: the output-gradient Grams spilled to the directory, one file per layer.

    def calibration(self) -> Calibration | None:
        """The calibration recorded (its spilled Grams read when used, each checked when the journal
        was opened), or None."""
        saved = self.state.get("calibration")
        if saved is None:
            return None
        outputs = {
            int(index): OutputGrams(
                None, None, None, tokens=entry["tokens"], path=self.directory / entry["file"]
            )
            for index, entry in saved["outputs"].items()
        }
        return Calibration({}, saved["tokens"], saved["sha256"], saved["sources"], outputs)

    def calibrated(self, calibration: Calibration) -> None:
        """Record a calibration whose output-gradient Grams are spilled into the directory."""
        outputs = {}
        for index, grams in calibration.outputs.items():
            if grams.path is None or Path(grams.path).parent.resolve() != self.directory.resolve():
                return  # held in memory: nothing on disk to continue from
            name = Path(grams.path).name
            outputs[str(index)] = {
                "file": name,
                "tokens": grams.tokens,
                "sha256": lazy.saved_digest(grams.path),
            }
        self.state["calibration"] = {**calibration.info, "outputs": outputs}
        self._write()

    # Allocation: each layer's measured sensitivity as it is made, then the ranks chosen and the report.

    def sensitivities(self) -> dict[int, LayerSensitivity]:
        """The layers the allocation has measured so far, by index."""
        saved = self.state.get("sensitivities", {})
        return {
            int(index): LayerSensitivity(
                int(index),
                tuple(
                    Spectrum(n, i, o, torch.tensor(e, dtype=torch.float64)) for n, i, o, e in data["spectra"]
                ),
                data["kl"],
                data["reference_rank"],
            )
            for index, data in saved.items()
        }

    def measured(self, layer: LayerSensitivity) -> None:
        # Floats print as the shortest string that reads back the same: the record is exact.
        spectra = [(s.name, s.in_features, s.out_features, s.energy.tolist()) for s in layer.spectra]
        self.state.setdefault("sensitivities", {})[str(layer.index)] = {
            "spectra": spectra,
            "kl": layer.kl,
            "reference_rank": layer.reference_rank,
        }
        self._write()

    def allocation(self) -> tuple[dict[int, dict[str, int]], dict] | None:
        saved = self.state.get("allocation")
        if saved is None:
            return None
        return {int(index): ranks for index, ranks in saved["planned"].items()}, saved["report"]

    def chosen(self) -> int | None:
        """How many layers the recorded allocation chose to compress (None before it is recorded)."""
        allocated = self.allocation()
        return None if allocated is None else len(allocated[0])

    def allocated(self, planned: dict[int, dict[str, int]], report: dict) -> None:
        """Record the allocation (the measurements it was made from are not needed again)."""
        self.state["allocation"] = {"planned": {str(i): r for i, r in planned.items()}, "report": report}
        self.state.pop("sensitivities", None)
        self._write()

    # Layers: each compressed layer once it is stored.

    def layers(self) -> dict[int, LayerRecord]:
        """The records of the layers stored, by index."""
        return {
            int(index): LayerRecord.from_dict(data) for index, data in self.state.get("layers", {}).items()
        }

    def stored(self, record: LayerRecord, path: Path, tally: dict | None = None) -> None:
        """Record layer ``record.index``, written to ``path`` in the directory (by :func:`lazy.save_atomic`,
        on disk before it counts), with the digest that file carries, and for quantized weights what the
        layer added to the quantization's ``tally``
        (:meth:`~svdmlp.int_weights.FakeQuantization.counts`)."""
        self.state.setdefault("layers", {})[str(record.index)] = asdict(record)
        self.state.setdefault("layer_files", {})[str(record.index)] = [path.name, lazy.saved_digest(path)]
        if tally is not None:
            self.state.setdefault("tallies", {})[str(record.index)] = tally
        self._write()

    def tallies(self) -> dict[int, dict]:
        """What each recorded layer of quantized weights added to the quantization's tally, by index."""
        return {int(index): tally for index, tally in self.state.get("tallies", {}).items()}

    def restore(
        self, model: nn.Module, spec: arch.ArchSpec, config: CompressConfig
    ) -> dict[int, LayerRecord]:
        """Install every recorded layer from its file (checked when the journal was opened): low-rank
        modules of its ranks, or quantized projections (``config.quantize``) with their corrections,
        read from disk as the layers this run stores are; the layers' records."""
        weights = lazy.of(model)
        layers = arch.decoder_layers(model, spec)
        records = self.layers()
        for index, record in records.items():
            if weights.shard(layers[index]).name != self.state["layer_files"][str(index)][0]:
                raise ValueError(f"{self.directory} was written for another model: delete it to start again")
            if config.quantize is not None:
                how, factors_how = STORED[config.quantize], factor_scheme(config.factor_bits)
                mlp = getattr(layers[index], spec.mlp)
                install_empty(mlp, spec, how, record.ranks, weights.dtype, factors_how)
            else:
                lowrank.install(model, spec, index, record.ranks, weights.dtype, "meta")
            weights.adopt(layers[index])
        return records

    # Healing: recorded when it ends; the stored layers kept as they were while it runs.

    def healing(self) -> dict | None:
        return self.state.get("healing")

    def before_healing(self) -> None:
        """Keep each stored layer's file as it is (a hard link beside it) while distillation runs."""
        for name, _ in self.state.get("layer_files", {}).values():
            path = self.directory / name
            before = path.with_name(path.name + distill.BEFORE)
            before.unlink(missing_ok=True)
            os.link(path, before)

    def healed(self, healing: dict) -> None:
        """Record the healing and the digests of the layers' files it changed, then drop the layers'
        copies from before it (a run stopped between the two drops them when it continues)."""
        self.state["healing"] = healing
        for entry in self.state.get("layer_files", {}).values():
            entry[1] = lazy.saved_digest(self.directory / entry[0])
        self._write()
        for name, _ in self.state.get("layer_files", {}).values():
            (self.directory / (name + distill.BEFORE)).unlink(missing_ok=True)


def _layers(indices: list[int]) -> str:
    return f"layer{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"


def _difference(saved: dict, plan: dict) -> str:
    """The first settings that differ between two plans, as ``name: saved -> now``."""
    flat_saved, flat_plan = _flatten(saved), _flatten(plan)
    keys = sorted(k for k in flat_saved.keys() | flat_plan.keys() if flat_saved.get(k) != flat_plan.get(k))
    return "; ".join(f"{k}: {flat_saved.get(k)} -> {flat_plan.get(k)}" for k in keys[:3])


def _flatten(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
