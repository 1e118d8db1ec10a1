"""The compression pipeline: the steps in order (:mod:`svdmlp.compression.steps`), and the journal.

1. check what to compress (layers, weights) and plan every matrix's rank with the rank rule, so that
   an impossible rank fails before any expensive work;
2. calibration: the dense model's Grams that are needed up front;
3. allocation (``--allocate``): the ranks re-planned from each layer's measured sensitivity;
4. factorisation of every layer, one-shot or sequentially;
5. healing by distillation, if asked;
6. quantization of the factors, if asked; then the report.

Each step is a module that gets the run's context and knows nothing of the journal. Given one
(:mod:`~svdmlp.compression.journal`, a run that can continue), this runner reads it once before each step
(what a stopped run recorded is not done again) and records each step's results as they are made.

A model whose layers stay on disk (:mod:`svdmlp.lazy`, what ``svdmlp compress`` loads) goes through the
same steps in bounded memory: every step works one decoder layer at a time, the output-gradient Grams
are kept on disk, and each compressed layer is written to disk once it has run on the calibration windows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn

from svdmlp import arch, lazy
from svdmlp.compression import quantized_dense
from svdmlp.compression.calibration import Calibration, source_weights
from svdmlp.compression.clock import StepClock
from svdmlp.compression.heal import distill
from svdmlp.compression.journal import Journal, resumable
from svdmlp.compression.report import CompressionReport, count_parameters
from svdmlp.compression.steps import allocation, factorisation, healing, quantization
from svdmlp.compression.steps import calibration as calibration_step
from svdmlp.compression.steps.context import Run
from svdmlp.config import CompressConfig


def compress(
    model: nn.Module,
    tokenizer,
    config: CompressConfig,
    calibration_text: str | None = None,
    progress: bool = True,
    calibration: Calibration | None = None,
    on_step: Callable[[str], None] | None = None,
    resident_healing: bool = False,
    journal: Journal | None = None,
    clock: StepClock | None = None,
) -> CompressionReport:
    """Factorise the MLPs of ``model`` in place as ``config`` says and report what was done.

    Args:
        model: a supported Hugging Face causal LM (see :mod:`svdmlp.arch`).
        tokenizer: its tokenizer (for the calibration text).
        config: keep, align, method, calibration and targets.
        calibration_text: overrides ``config.calibration.source`` when given.
        calibration: Grams from :func:`svdmlp.compression.steps.calibration.collect_shared` on the same dense model
            and config (keep aside); when given, no calibration forward pass runs here. In sequential
            mode the dense Grams only serve budget allocation: each layer is calibrated as it comes.
        on_step: called with each step's name as it ends, for the steps that run (the command line's
            time left).
        resident_healing: a model on disk is loaded whole for distillation (faster, where memory
            allows: see :func:`distill.distill`).
        journal: a model on disk's progress: what it records is not done again, and what is done is
            recorded as it ends. Only for a plan :func:`~svdmlp.compression.journal.resumable` says
            can continue.
        clock: times the steps, with what the caller did for them before (a sweep's shared
            calibration); with a journal, the journal's, which holds the earlier runs' time.

    Returns:
        A report with every decoder layer (compressed or skipped with the reason), ranks, achieved
        keep, errors, parameter counts and the hash of the calibration tokens.
    """
    if journal is not None and (not resumable(config) or lazy.of(model) is None):
        raise ValueError("a journal is for a model on disk and a plan that can continue (journal.resumable)")
    clock = journal.clock if journal is not None else clock or StepClock()
    if config.quantize is not None:
        return _store_quantized(model, tokenizer, config, progress, on_step, clock, journal)
    clock.switch("calibration")  # the checks and the windows' drawing count with it
    run = Run(model, tokenizer, config, calibration_text, progress, resident_healing, clock, on_step)
    before = count_parameters(model, run.mlp_names)

    run.collected_here = calibration is None
    collected = calibration or (journal.calibration() if journal is not None else None)
    if collected is None and calibration_step.needed(run):
        collected = calibration_step.collect(run)
        if journal is not None:
            journal.calibrated(collected)
        run.done("calibration")
    calibration_step.use(run, collected)
    grams_used = config.needs_calibration and bool(run.to_compress)
    teacher = (
        distill.DenseTeacher(model, run.spec, run.to_compress)
        if config.heals_lora and run.to_compress
        else None
    )

    allocated = journal.allocation() if journal is not None else None
    if allocated is None and allocation.needed(run):
        clock.switch("allocation")
        measured = journal.sensitivities() if journal is not None else {}
        allocated = allocation.allocate(run, measured, journal.measured if journal is not None else None)
        if journal is not None:
            journal.allocated(*allocated)
        run.done("allocation")
    if allocated is not None:
        allocation.apply(run, *allocated)

    clock.switch("factorisation")
    if journal is not None:
        if config.needs_calibration:
            run.windows()  # drawn while the model is dense (``self`` samples it), before the layers come back
        run.records = journal.restore(model, run.spec, config)
    records = factorisation.factorise(run, journal.stored if journal is not None else None)
    run.done("factorisation")

    run.healing = (journal.healing() if journal is not None else None) or {}
    if not run.healing and teacher is not None:
        clock.switch("healing")
        if journal is not None:
            journal.before_healing()
        run.healing = healing.heal(run, teacher)
        if journal is not None:
            journal.healed(run.healing)
        run.done("healing")
    del teacher  # the dense MLPs it kept
    after = count_parameters(model, run.mlp_names)  # before quantization turns the factors into buffers
    if quantization.needed(run):
        clock.switch("quantization")
        run.quantization = quantization.quantize(run)
        run.done("quantization")
    clock.switch(None)
    timings = clock.totals()
    return CompressionReport(
        layers=records,
        params_before=before,
        params_after=after,
        seconds=sum(timings.values()),
        timings=timings,
        calibration=run.calibration_info,
        error_metric="activation-weighted" if grams_used else "weight-frobenius",
        healing=run.healing,
        allocation=run.allocation,
        quantization=run.quantization,
    )


def _store_quantized(
    model, tokenizer, config, progress, on_step, clock: StepClock, journal: Journal | None
) -> CompressionReport:
    """``config.quantize``: every MLP weight stored quantized (with its correction), nothing factorised
    (:func:`~svdmlp.compression.quantized_dense.store_quantized_mlps`), continuing from the layers a
    stopped run's ``journal`` records. The parameters after count the corrections' on top of the
    weights'; the bytes are in the report's quantization."""
    spec = arch.of_model(model)
    names = [arch.mlp_name(spec, i) for i in range(len(arch.decoder_layers(model, spec)))]
    before = count_parameters(model, names)
    allocated = journal.allocation() if journal is not None else None
    if allocated is None and config.allocation == "budget" and config.correction_keep:
        clock.switch("allocation")  # on the dense model: before a stopped run's layers come back
        allocated = quantized_dense.allocate_corrections(
            model, tokenizer, config.quantize, config, config.correction_keep, progress
        )
        if journal is not None:
            journal.allocated(*allocated)
        if on_step is not None:
            on_step("allocation")
    clock.switch("quantization")
    done = {}
    if journal is not None:
        tallies = journal.tallies()
        done = {
            index: (record, tallies[index]) for index, record in journal.restore(model, spec, config).items()
        }
    on_stored = journal.stored if journal is not None else None
    layers, quantization = quantized_dense.store_quantized_mlps(
        model,
        tokenizer,
        config,
        progress,
        done=done,
        on_stored=on_stored,
        allocated=None if allocated is None else allocated[0],
    )
    clock.switch(None)
    if on_step is not None:
        on_step("quantization")
    extra = quantization.get("correction_params", 0)
    timings = clock.totals()
    return CompressionReport(
        layers=layers,
        params_before=before,
        params_after={"total": before["total"] + extra, "mlp": before["mlp"] + extra},
        seconds=sum(timings.values()),
        timings=timings,
        calibration={
            "sources": source_weights(config, None),
            "tokens": quantization.pop("calibration_tokens"),
            "sha256": quantization.pop("calibration_sha256"),
            "sequential": True,
        },
        allocation={} if allocated is None else allocated[1],
        quantization=quantization,
    )
