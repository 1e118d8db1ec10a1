"""The compression pipeline: the order of the steps, and nothing else.

1. check what to compress (layers, weights) and plan every matrix's rank with the rank rule, so that
   an impossible rank fails before any expensive work;
2. calibrate: the dense model's activation Grams (one-shot, or for budget allocation) and, for the
   ``fisher`` method, its output-gradient Grams (one forward and backward pass per window);
3. with ``--allocate``, re-plan the ranks from each layer's measured sensitivity;
4. factorise every layer, one-shot or sequentially (each layer calibrated on the compressed layers
   before it, with closed-form healing of down if asked);
5. heal by distillation if asked, and report.

Each step lives in its own module and gets what it needs as arguments; none calls back into this one.
Given a journal (:mod:`~svdmlp.compression.journal`), each step's result is recorded as it ends, and a
step a stopped run recorded is not done again.

A model whose layers stay on disk (:mod:`svdmlp.lazy`, what ``svdmlp compress`` loads) goes through the
same steps in bounded memory: every step works one decoder layer at a time, the output-gradient Grams
are kept on disk, and each compressed layer is written to disk (:meth:`~svdmlp.lazy.DiskWeights.store`)
once it has run on the calibration windows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from svdmlp import arch, corpora, lazy, runtime
from svdmlp.compression import factorise, quantized_factors, ranks, sensitivity, sequential
from svdmlp.compression.calibration import (
    Calibration,
    config_windows,
    source_weights,
    tokens_hash,
    training_and_validation,
)
from svdmlp.compression.clock import StepClock
from svdmlp.compression.heal import distill
from svdmlp.compression.journal import Journal, resumable
from svdmlp.compression.report import CompressionReport, LayerRecord, count_parameters
from svdmlp.config import CompressConfig
from svdmlp.int_weights import factor_scheme

# Tokens scored per layer and candidate rank to measure its sensitivity (--allocate): the 512 that the
# allocation was validated with on SmolLM2 (BENCHMARKS.md), in windows of at most 256 tokens and at
# least one per calibration source (a mixture of five: 5 windows of 102 tokens), never under 64 tokens.
SENSITIVITY_TOKENS = 512
SENSITIVITY_SEQ_LEN = 256
SENSITIVITY_MIN_SEQ_LEN = 64
# Keeps whose sensitivities one pass measures at most (measure_sensitivities): each adds its factors of the
# layer's projections to the memory of the pass (float32 at keep 0.9: 0.15 GB for Qwen2.5-Coder-1.5B,
# 0.64 GB for Llama-3.1-8B), so that a sweep's memory does not grow with its number of keeps.
MEASURED_KEEPS = 3
# Validation windows of each calibration source on which distillation healing is judged.
HEAL_VALIDATION = 1


def probe_shape(sources: int, calibration_seq_len: int) -> tuple[int, int]:
    """(windows, tokens each) of the sensitivity probes for a mixture of ``sources`` texts."""
    count = max(sources, SENSITIVITY_TOKENS // SENSITIVITY_SEQ_LEN)
    seq_len = max(SENSITIVITY_MIN_SEQ_LEN, min(SENSITIVITY_SEQ_LEN, SENSITIVITY_TOKENS // count))
    return count, min(seq_len, calibration_seq_len)


def _check_layers(config: CompressConfig, num_layers: int) -> list[int]:
    if config.layers is None:
        return list(range(num_layers))
    bad = [i for i in config.layers if i >= num_layers]
    if bad:
        raise ValueError(f"layers {bad} do not exist: the model has {num_layers} decoder layers")
    return list(config.layers)


def _check_weights(model: nn.Module, spec: arch.ArchSpec, index: int, config: CompressConfig) -> str:
    """Reason to skip this layer's MLP, or "" to compress it; NaN/inf weights are an error."""
    with lazy.held(model, arch.decoder_layers(model, spec)[index]):
        return _check_loaded_weights(model, spec, index, config)


def _check_loaded_weights(model: nn.Module, spec: arch.ArchSpec, index: int, config: CompressConfig) -> str:
    reason = ""
    for name in config.targets:
        linear = arch.dense_projection(model, spec, index, name)
        if not isinstance(linear, nn.Linear):
            return f"{spec.projection(name)} is a {type(linear).__name__}, not a dense nn.Linear"
        if not runtime.all_finite(linear.weight):
            raise ValueError(f"{arch.mlp_name(spec, index)}.{spec.projection(name)} has NaN or inf weights")
        if linear.bias is not None:
            reason = f"{spec.projection(name)} has a bias (not supported by the low-rank modules)"
    return reason


# A layer the allocation found worth its full rank (see ranks.allocate_layer_ranks): left dense.
LEFT_DENSE = "left dense by the allocation"


def _layers_to_compress(model: nn.Module, spec: arch.ArchSpec, config: CompressConfig):
    """(selected layer indices, skip reason per selected index, indices to compress)."""
    selected = _check_layers(config, len(arch.decoder_layers(model, spec)))
    skip = {i: _check_weights(model, spec, i, config) for i in selected}
    return selected, skip, [i for i in selected if not skip[i]]


def _rule_ranks(model, spec, config, indices) -> dict[int, dict[str, int]]:
    """The rank rule's rank of every targeted projection of layers ``indices``."""
    planned = {}
    for index in indices:
        linears = {name: arch.dense_projection(model, spec, index, name) for name in config.targets}
        shapes = {name: (linear.in_features, linear.out_features) for name, linear in linears.items()}
        planned[index] = ranks.uniform_ranks(shapes, config.keep, config.align)
    return planned


def shared_calibration(model: nn.Module, config: CompressConfig) -> bool:
    """Whether :func:`collect_calibration` has anything for compressions of ``model`` to share: the
    output-gradient Grams, or a model in memory's input Grams."""
    return config.needs_output_grams or (config.needs_dense_grams and lazy.of(model) is None)


def collect_calibration(
    model: nn.Module,
    tokenizer,
    config: CompressConfig,
    calibration_text: str | None = None,
    progress: bool = True,
    spill: Path | None = None,
) -> Calibration:
    """Collect the Grams :func:`compress` needs for ``config`` (any keep) from the dense ``model``, to
    share between compressions (a sweep's keeps).

    A model in memory gets every Gram it uses; a model on disk only the output-gradient Grams, kept in
    ``spill`` (its input Grams are made one layer at a time by each compression).
    """
    spec = arch.of_model(model)
    bos = arch.bos_token_id(spec, tokenizer)
    windows = config_windows(tokenizer, config, calibration_text, bos=bos, model=model)
    indices = _layers_to_compress(model, spec, config)[2]
    inputs = config.needs_dense_grams and lazy.of(model) is None
    return _collect(model, spec, windows, indices, progress, config, calibration_text, inputs, spill)


def _collect(
    model, spec, windows, indices, progress, config, calibration_text, inputs=True, spill=None
) -> Calibration:
    sources = source_weights(config, calibration_text)
    fisher = config.needs_output_grams
    weights = lazy.of(model)
    if spill is None and weights is not None:  # a model on disk: its Grams on disk too
        spill = weights.scratch
    return Calibration.collect(
        model, spec, windows, indices, progress, sources, fisher, config.seed, inputs, spill
    )


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
        calibration: Grams from :func:`collect_calibration` on the same dense model and config
            (keep aside); when given, no calibration forward pass runs here. In sequential mode
            the dense Grams only serve budget allocation: each layer is calibrated as it comes.
        on_step: called with each step's name ("calibration", "allocation", "factorisation",
            "healing") as it ends, for the steps that run (the command line's time left).
        resident_healing: a model on disk is loaded whole for distillation (faster, where memory
            allows: see :func:`distill.distill`).
        journal: a model on disk's progress (:mod:`~svdmlp.compression.journal`): what it records is
            not done again, and what is done is recorded as it ends. Only for a plan
            :func:`~svdmlp.compression.journal.resumable` says can continue.
        clock: times the steps, with what the caller did for them before (a sweep's shared
            calibration); with a journal, the journal's, which holds the earlier runs' time.

    Returns:
        A report with every decoder layer (compressed or skipped with the reason), ranks, achieved
        keep, errors, parameter counts and the hash of the calibration tokens.
    """
    if journal is not None and (not resumable(config) or lazy.of(model) is None):
        raise ValueError("a journal is for a model on disk and a plan that can continue (journal.resumable)")
    clock = journal.clock if journal is not None else clock or StepClock()
    clock.switch("calibration")  # the checks and the windows' drawing count with it

    def step_done(step: str) -> None:
        # A step's activations (a 1.5B model's 224 windows: 0.7 GB of hidden states, as many MLP inputs)
        # come from glibc's heap, which keeps part of them once freed (0.4 GB of a distillation's floor
        # after a 224-window factorisation, BENCHMARKS.md session 22): given back before the next step.
        runtime.trim_heap()
        if on_step is not None:
            on_step(step)

    spec = arch.of_model(model)
    layers = arch.decoder_layers(model, spec)
    selected, skip, to_compress = _layers_to_compress(model, spec, config)
    mlp_names = [arch.mlp_name(spec, i) for i in range(len(layers))]
    before = count_parameters(model, mlp_names)
    planned = _rule_ranks(model, spec, config, to_compress)  # fails on an impossible rank, before any work

    bos = arch.bos_token_id(spec, tokenizer)  # calibrate on what the model sees at run time
    windows = _Windows(model, tokenizer, config, calibration_text, bos)

    grams, outputs, calibration_info = {}, {}, {}
    collected_here = calibration is None  # Grams of our own, spilled to disk: deleted once used
    # The output-gradient Grams are made up front (a backward pass needs the whole model); the input
    # Grams one layer at a time, as each layer's turn comes, except for one-shot factorising of a
    # model in memory after budget allocation, which reuses the probes' Grams and their whitenings.
    reuse = not config.sequential and config.allocation == "budget" and lazy.of(model) is None
    if calibration is None and journal is not None:
        calibration = journal.calibration()
    if (
        calibration is None
        and (config.needs_output_grams or reuse and config.needs_calibration)
        and to_compress
    ):
        calibration = _collect(model, spec, windows(), to_compress, progress, config, calibration_text, reuse)
        if journal is not None:
            journal.calibrated(calibration)
        step_done("calibration")
    if calibration is not None and config.needs_calibration and to_compress:
        missing = sorted(set(to_compress) - set(calibration.grams))
        if missing and calibration.grams and not config.sequential:
            raise ValueError(f"the calibration given has no Grams for layers {missing}")
        if config.needs_output_grams and set(to_compress) - set(calibration.outputs):
            raise ValueError(
                "the calibration given has no output-gradient Grams, which method 'fisher' needs"
            )
        grams = {i: calibration.grams[i] for i in to_compress if i in calibration.grams}  # popped below
        outputs = calibration.outputs
        calibration_info = calibration.info
    grams_used = config.needs_calibration and bool(to_compress)
    teacher = distill.DenseTeacher(model, spec, to_compress) if config.heals_lora and to_compress else None

    allocation = {}
    allocated = journal.allocation() if journal is not None else None
    if allocated is not None:
        planned, allocation = allocated
    elif config.allocation == "budget" and to_compress:
        clock.switch("allocation")
        measuring = time.perf_counter()
        measured = journal.sensitivities() if journal is not None else {}
        to_probe = sorted(set(planned) - set(measured))
        for (layer,) in _measure(model, spec, [planned], to_probe, grams, outputs, windows, progress):
            measured[layer.index] = layer
            if journal is not None:
                journal.measured(layer)
        probes = windows.probes()
        seconds = time.perf_counter() - measuring
        planned, allocation = sensitivity.allocate(
            planned, measured, probes, config.keep, config.align, seconds
        )
        if journal is not None:
            journal.allocated(planned, allocation)
        step_done("allocation")
    if allocation:
        for index in [i for i in to_compress if i not in planned]:
            skip[index] = LEFT_DENSE
            grams.pop(index, None)
            if collected_here:
                _discard(outputs.get(index))
        to_compress = [i for i in to_compress if i in planned]

    clock.switch("factorisation")
    done_by_index = {}
    if journal is not None:
        if config.needs_calibration:
            windows()  # drawn while the model is dense (``self`` samples it), before the layers come back
        done_by_index = journal.restore(model, spec)

    def stored(index: int | None) -> None:
        """Layer ``index`` has run on the calibration windows: written to disk, dropped, recorded."""
        path = _store(model, layers, index)
        if index is not None and journal is not None:
            journal.stored(done_by_index[index], path)

    layer_by_layer = config.sequential or (config.needs_calibration and not grams)
    if layer_by_layer and to_compress:
        grams.clear()  # only the ranks came from the dense Grams
        clock.switch("calibration")  # the walk to each layer, each layer's Grams
        tokens = windows()
        layers_in_order = sequential.calibrated_layers(
            model,
            spec,
            tokens,
            sorted(set(planned) - set(done_by_index)),
            keep_inputs=config.heals_closed_form,
            progress=progress,
            dense=not config.sequential,
        )
        previous = None
        for index, layer_grams, inputs in layers_in_order:
            clock.switch("factorisation")
            stored(previous)
            layer_grams.outputs = outputs.get(index)  # the dense model's: a one-shot approximation
            layer_grams.keep_whitenings = lazy.of(model) is None  # a big model's: one at a time
            done_by_index[index] = factorise.layer(model, spec, index, planned[index], layer_grams, inputs)
            if collected_here:
                _discard(outputs.get(index))
            del layer_grams, inputs  # before the walk makes the next layer's
            previous = index
            clock.switch("calibration")
        clock.switch("factorisation")
        stored(previous)
        calibration_info = {
            "tokens": tokens.numel(),
            "sha256": tokens_hash(tokens),
            "sources": source_weights(config, calibration_text),
            **({"sequential": True} if config.sequential else {}),
        }
    records = []
    for index in range(len(layers)):
        name = mlp_names[index]
        if index not in selected:
            records.append(LayerRecord(index, name, "skipped", "not selected by config.layers"))
        elif skip[index]:
            records.append(LayerRecord(index, name, "skipped", skip[index]))
        elif index in done_by_index:
            records.append(done_by_index[index])
        else:
            with lazy.held(model, layers[index]):  # each layer's Grams freed as soon as it is done
                records.append(factorise.layer(model, spec, index, planned[index], grams.pop(index, None)))
            done_by_index[index] = records[-1]
            stored(index)
            if collected_here:
                _discard(outputs.get(index))
    step_done("factorisation")

    healing = journal.healing() if journal is not None else None
    if healing is None and teacher is not None:
        clock.switch("healing")
        if journal is not None:
            journal.before_healing()
        healing = _heal_by_distillation(
            model, tokenizer, config, teacher, calibration_text, bos, progress, resident_healing
        )
        if journal is not None:
            journal.healed(healing)
        step_done("healing")
    healing = healing or {}
    del teacher  # the dense MLPs it kept
    after = count_parameters(model, mlp_names)  # before quantization turns the factors into buffers
    quantization = {}
    how = factor_scheme(config.factor_bits)
    if how is not None:
        clock.switch("quantization")
        quantization = quantized_factors.quantize_layers(
            model,
            spec,
            layers,
            how,
            windows() if config.needs_calibration else None,  # plain SVD draws no windows
            lambda index: _store(model, layers, index),
            progress,
        )
        step_done("quantization")
    clock.switch(None)
    timings = clock.totals()
    return CompressionReport(
        layers=records,
        params_before=before,
        params_after=after,
        seconds=sum(timings.values()),
        timings=timings,
        calibration=calibration_info,
        error_metric="activation-weighted" if grams_used else "weight-frobenius",
        healing=healing,
        allocation=allocation,
        quantization=quantization,
    )


def quantize_factors(model: nn.Module, tokenizer, config: CompressConfig, progress: bool = True) -> dict:
    """Quantize the factors of an already compressed ``model`` (a checkpoint's) as
    ``config.factor_bits`` says, calibrated on the windows that compressing with ``config`` drew (the
    same sources, count, length and seed; plain SVD's: rounded to nearest); the report's ``quantization``."""
    how = factor_scheme(config.factor_bits)
    if how is None:
        raise ValueError("factor bits 16 keep the factors in floating point: nothing to quantize")
    spec = arch.of_model(model)
    windows = None
    if config.needs_calibration:
        if corpora.SELF in dict(config.calibration.mixture):
            raise ValueError(
                "this checkpoint was calibrated on the dense model's own samples, which only the dense "
                "model can draw: compress again with --factor-bits instead"
            )
        windows = config_windows(tokenizer, config, None, bos=arch.bos_token_id(spec, tokenizer))
    layers = arch.decoder_layers(model, spec)
    return quantized_factors.quantize_layers(model, spec, layers, how, windows, lambda index: None, progress)


def measure_sensitivities(
    model: nn.Module,
    tokenizer,
    configs: list[CompressConfig],
    journals: list[Journal],
    calibration: Calibration | None = None,
    progress: bool = True,
) -> None:
    """Measure the sensitivity of every layer that :func:`compress` allocates ranks to (``--allocate``)
    for several keeps at once, into each keep's journal; each compression then allocates from it.

    A sweep's keeps share the expensive part: each layer's dense Grams, its whitened decompositions
    and the dense model's predictions, made once instead of once per keep; each keep adds only its
    factors and its probe (BENCHMARKS.md, session 19). The measurements equal those each compression
    would make alone.

    Args:
        configs: the same plan at up to :data:`MEASURED_KEEPS` keeps (a budget allocation on a model
            on disk).
        journals: each config's (:mod:`~svdmlp.compression.journal`); a layer one of them has measured
            already is not recorded there again.
        calibration: the output-gradient Grams the compressions share (:func:`collect_calibration`),
            for the ``fisher`` method.
    """
    plans = [{k: v for k, v in c.to_dict().items() if k != "keep"} for c in configs]
    if any(plan != plans[0] for plan in plans) or configs[0].allocation != "budget":
        raise ValueError("sensitivities are shared by budget allocations of one plan at different keeps")
    if len(configs) > MEASURED_KEEPS:
        raise ValueError(
            f"at most {MEASURED_KEEPS} keeps' sensitivities are measured at once, got {len(configs)}"
        )
    config = configs[0]
    spec = arch.of_model(model)
    to_compress = _layers_to_compress(model, spec, config)[2]
    references = [_rule_ranks(model, spec, c, to_compress) for c in configs]
    measured = [journal.sensitivities() for journal in journals]
    to_probe = [i for i in to_compress if any(i not in done for done in measured)]
    if config.needs_output_grams and (calibration is None or set(to_probe) - set(calibration.outputs)):
        raise ValueError(
            "method 'fisher' measures sensitivity with the output-gradient Grams: none were given"
        )
    outputs = calibration.outputs if calibration is not None else {}
    windows = _Windows(model, tokenizer, config, None, arch.bos_token_id(spec, tokenizer))
    desc = f"sensitivity of keeps {', '.join(f'{c.keep:g}' for c in configs)}"
    for layers in _measure(model, spec, references, to_probe, {}, outputs, windows, progress, desc):
        for journal, done, layer in zip(journals, measured, layers, strict=True):
            if layer.index not in done:
                journal.measured(layer)


class _Windows:
    """The windows a compression draws, each set drawn once (the calibration windows serve several
    steps), always before any layer is factorised (``self`` windows are sampled by the dense model)."""

    def __init__(self, model, tokenizer, config: CompressConfig, calibration_text: str | None, bos):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.calibration_text, self.bos = calibration_text, bos
        self.drawn: dict[tuple, torch.Tensor] = {}

    def __call__(self, count: int | None = None, seq_len: int | None = None, seed: int | None = None):
        key = (count, seq_len, seed)
        if key not in self.drawn:
            self.drawn[key] = config_windows(
                self.tokenizer, self.config, self.calibration_text, count, seq_len, seed, self.bos, self.model
            )
        return self.drawn[key]

    def probes(self) -> torch.Tensor:
        """The windows the sensitivity probes score (:func:`probe_shape`)."""
        sources = len(source_weights(self.config, self.calibration_text))
        count, seq_len = probe_shape(sources, self.config.calibration.seq_len)
        return self(count, seq_len, self.config.seed + 3)


def _measure(
    model, spec, references, to_probe, grams, outputs, windows: _Windows, progress, desc="sensitivity"
):
    """:func:`sensitivity.measure` of layers ``to_probe`` at each of ``references``' ranks, on the dense
    Grams in ``grams`` (one-shot calibration of a model in memory) or else made one layer at a time."""
    if not to_probe:
        return
    if grams or not windows.config.needs_calibration:
        dense = ((index, grams.get(index)) for index in to_probe)
    else:
        dense = _dense_layers(model, spec, windows(), to_probe, outputs)
    layers = sensitivity.measure(model, spec, references, dense, windows.probes())
    yield from tqdm(layers, total=len(to_probe), desc=desc, unit="layer", disable=not progress)


def _dense_layers(model, spec, tokens, indices, outputs):
    """``(index, Grams)`` of the dense model's layers ``indices``, made one layer at a time (the
    model is left dense between items, so each layer runs once), with their output-gradient Grams attached."""
    walk = sequential.calibrated_layers(model, spec, tokens, indices, progress=False, dense=True)
    for index, layer_grams, _ in walk:
        layer_grams.outputs = outputs.get(index)
        layer_grams.keep_whitenings = lazy.of(model) is None
        yield index, layer_grams
        del layer_grams  # before the walk makes the next layer's


def _discard(output_grams) -> None:
    """Delete a layer's spilled output-gradient Grams once its layer is compressed."""
    if output_grams is not None:
        output_grams.discard()


def _store(model: nn.Module, layers, index: int | None) -> Path | None:
    """Write compressed layer ``index`` to disk and drop it from memory, when the model lives on disk;
    the file."""
    return lazy.store(model, layers[index]) if index is not None else None


def _heal_by_distillation(
    model, tokenizer, config, teacher, calibration_text, bos, progress, resident
) -> dict:
    """Run :func:`distill.distill` on windows of its own (training and, per calibration source,
    validation windows disjoint from them); what the report records of it."""
    lora = config.lora
    with teacher.active():  # ``self`` windows are sampled by the dense model
        training, validation = training_and_validation(
            tokenizer,
            config,
            calibration_text,
            lora.steps,
            lora.seq_len,
            config.seed + 1,
            bos,
            HEAL_VALIDATION,
            model,
        )
    result = distill.distill(model, teacher, training, validation, lora, progress=progress, resident=resident)
    return {
        "method": "lora",
        **result.to_dict(),
        "lr": lora.lr,
        "relative_lr": lora.relative_lr,
        "seq_len": lora.seq_len,
        "sha256": tokens_hash(training),
    }
