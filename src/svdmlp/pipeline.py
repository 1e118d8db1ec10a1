"""The compression pipeline: calibrate, factorise every targeted MLP matrix, swap, report."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from svdmlp import arch, calibrate, corpora, decompose, distill, heal, ranks, sensitivity, sequential, swap
from svdmlp.config import CompressConfig
from svdmlp.report import CompressionReport, LayerRecord, ProjectionRecord, count_parameters


def arch_of(model: nn.Module) -> arch.ArchSpec:
    """The supported-architecture spec of a loaded model (ValueError for anything else)."""
    spec = arch.resolve(model.config.model_type)
    arch.check_activation(spec, model.config.get_text_config())
    return spec


def _check_layers(config: CompressConfig, num_layers: int) -> list[int]:
    if config.layers is None:
        return list(range(num_layers))
    bad = [i for i in config.layers if i >= num_layers]
    if bad:
        raise ValueError(f"layers {bad} do not exist: the model has {num_layers} decoder layers")
    return list(config.layers)


def _check_weights(model: nn.Module, spec: arch.ArchSpec, index: int, config: CompressConfig) -> str:
    """Reason to skip this layer's MLP, or "" to compress it; NaN/inf weights are an error."""
    reason = ""
    for name in config.targets:
        linear = swap.dense_projection(model, spec, index, name)
        if not isinstance(linear, nn.Linear):
            return f"{spec.projection(name)} is a {type(linear).__name__}, not a dense nn.Linear"
        if not torch.isfinite(linear.weight).all():
            raise ValueError(f"{swap.mlp_name(spec, index)}.{spec.projection(name)} has NaN or inf weights")
        if linear.bias is not None:
            reason = f"{spec.projection(name)} has a bias (not supported by the low-rank modules)"
    return reason


@dataclass(frozen=True)
class Calibration:
    """The activation Grams of the layers to compress and the hash of the tokens that made them.

    They depend on the model, the calibration text and seed, not on keep: a sweep over keep collects
    them once with :func:`collect_calibration` and passes them to every :func:`compress`, which
    then shares the forward passes and each Gram's eigendecomposition (kept with it) across keeps.
    """

    grams: dict[int, calibrate.LayerGrams]
    tokens: int
    sha256: str
    seconds: float

    @property
    def info(self) -> dict:
        """What the compression report records about the calibration."""
        return {"tokens": self.tokens, "sha256": self.sha256}


def _layers_to_compress(model: nn.Module, spec: arch.ArchSpec, config: CompressConfig):
    """(selected layer indices, skip reason per selected index, indices to compress)."""
    selected = _check_layers(config, len(arch.decoder_layers(model, spec)))
    skip = {i: _check_weights(model, spec, i, config) for i in selected}
    return selected, skip, [i for i in selected if not skip[i]]


def collect_calibration(
    model: nn.Module,
    tokenizer,
    config: CompressConfig,
    calibration_text: str | None = None,
    progress: bool = True,
) -> Calibration:
    """Collect the Grams :func:`compress` needs for ``config`` (any keep) from the dense ``model``."""
    spec = arch_of(model)
    return _calibrate(
        model,
        tokenizer,
        config,
        spec,
        _layers_to_compress(model, spec, config)[2],
        calibration_text,
        progress,
    )


def _windows(
    tokenizer,
    config: CompressConfig,
    calibration_text: str | None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    seed: int | None = None,
) -> torch.Tensor:
    """Token windows ``(num_samples, seq_len)`` of the calibration text or mixture ``config`` names.

    Defaults are the calibration's own count, length and seed; healing draws its own with others.
    """
    spec_c = config.calibration
    if calibration_text is not None:
        texts = [(calibration_text, 1.0)]
    else:
        texts = [(corpora.read_text(source), weight) for source, weight in spec_c.mixture]
    return calibrate.mixture_windows(
        tokenizer,
        texts,
        spec_c.num_samples if num_samples is None else num_samples,
        spec_c.seq_len if seq_len is None else seq_len,
        config.seed if seed is None else seed,
    )


def _calibrate(model, tokenizer, config, spec, indices, calibration_text, progress) -> Calibration:
    started = time.perf_counter()
    windows = _windows(tokenizer, config, calibration_text)
    grams = calibrate.collect_grams(model, spec, windows, indices, progress=progress)
    return Calibration(grams, windows.numel(), calibrate.tokens_hash(windows), time.perf_counter() - started)


def compress(
    model: nn.Module,
    tokenizer,
    config: CompressConfig,
    calibration_text: str | None = None,
    progress: bool = True,
    calibration: Calibration | None = None,
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

    Returns:
        A report with every decoder layer (compressed or skipped with the reason), ranks, achieved
        keep, errors, parameter counts and the hash of the calibration tokens.
    """
    started = time.perf_counter()
    spec = arch_of(model)
    layers = arch.decoder_layers(model, spec)
    selected, skip, to_compress = _layers_to_compress(model, spec, config)
    mlp_names = [swap.mlp_name(spec, i) for i in range(len(layers))]
    before = count_parameters(model, mlp_names)
    for index in to_compress:  # fail on an impossible rank before any expensive work
        for name in config.targets:
            linear = swap.dense_projection(model, spec, index, name)
            decompose.rank_for_keep(linear.in_features, linear.out_features, config.keep, config.align)

    grams, calibration_info = {}, {}
    calibrated = time.perf_counter()
    if config.needs_dense_grams and to_compress:
        if calibration is None:
            calibration = _calibrate(model, tokenizer, config, spec, to_compress, calibration_text, progress)
        missing = sorted(set(to_compress) - set(calibration.grams))
        if missing:
            raise ValueError(f"the calibration given has no Grams for layers {missing}")
        grams = {i: calibration.grams[i] for i in to_compress}  # popped below; the caller's dict stays
        calibration_info = calibration.info

    grams_used = bool(grams) or (config.sequential and bool(to_compress))
    teacher = distill.DenseTeacher(model, spec, to_compress) if config.heals_lora and to_compress else None
    factorising = time.perf_counter()
    planned, allocation = _plan_ranks(
        model, tokenizer, spec, config, to_compress, grams, calibration_text, progress
    )
    done_by_index, sequential_calibration = {}, 0.0
    if config.sequential and to_compress:
        grams.clear()  # only the ranks came from the dense Grams
        done_by_index, calibration_info, sequential_calibration = _compress_sequential(
            model, tokenizer, config, spec, planned, calibration_text, progress
        )
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
            layer_grams = grams.pop(index, None)  # free each layer's Grams as soon as it is done
            records.append(_compress_layer(model, spec, index, planned[index], layer_grams))
    done = time.perf_counter()
    healing, timings = {}, {}
    if allocation:
        timings["allocation"] = allocation["seconds"]
    if teacher is not None:
        healing = _heal_by_distillation(model, tokenizer, config, teacher, calibration_text, progress)
        timings["healing"] = healing["seconds"]
    del teacher  # the dense MLPs it kept
    finished = time.perf_counter()
    return CompressionReport(
        layers=records,
        params_before=before,
        params_after=count_parameters(model, mlp_names),
        seconds=finished - started,
        timings={
            "calibration": factorising - calibrated + sequential_calibration,
            "factorisation": done - factorising - sequential_calibration - timings.get("allocation", 0.0),
            **timings,
        },
        calibration=calibration_info,
        error_metric="activation-weighted" if grams_used else "weight-frobenius",
        healing=healing,
        allocation=allocation,
    )


def _heal_by_distillation(model, tokenizer, config, teacher, calibration_text, progress) -> dict:
    """Run :func:`svdmlp.distill.distill` on windows of its own; what the report records of it."""
    lora = config.lora
    windows = _windows(tokenizer, config, calibration_text, lora.steps, lora.seq_len, config.seed + 1)
    texts = 1 if calibration_text is not None else len(config.calibration.mixture)
    validation = _windows(tokenizer, config, calibration_text, max(2, texts), lora.seq_len, config.seed + 2)
    result = distill.distill(model, teacher, windows, validation, lora, progress=progress)
    return {
        "method": "lora",
        **result.to_dict(),
        "lr": lora.lr,
        "seq_len": lora.seq_len,
        "sha256": calibrate.tokens_hash(windows),
    }


def _compress_sequential(model, tokenizer, config, spec, planned, calibration_text, progress):
    """Compress the planned layers in order, each calibrated on the compressed layers' outputs.

    Returns (layer records by index, calibration info, seconds spent calibrating, i.e. outside
    the factorisation of each layer).
    """
    started = time.perf_counter()
    windows = _windows(tokenizer, config, calibration_text)
    factorising = 0.0

    def compress_layer(index, grams, inputs):
        nonlocal factorising
        begun = time.perf_counter()
        record = _compress_layer(model, spec, index, planned[index], grams, inputs)
        factorising += time.perf_counter() - begun
        return record

    records = sequential.compress_layers(
        model,
        spec,
        windows,
        sorted(planned),
        compress_layer,
        keep_inputs=config.heals_closed_form,
        progress=progress,
    )
    info = {"tokens": windows.numel(), "sha256": calibrate.tokens_hash(windows), "sequential": True}
    return records, info, time.perf_counter() - started - factorising


# Windows scored per layer to measure its sensitivity (--allocate), and their length at most: the
# 512 tokens per probe that the allocation was validated with on SmolLM2 (BENCHMARKS.md).
SENSITIVITY_WINDOWS = 2
SENSITIVITY_SEQ_LEN = 256


def _plan_ranks(model, tokenizer, spec, config, indices, grams, calibration_text, progress):
    """Each layer's projection ranks, and what the report records of how they were chosen.

    Uniform: the rank rule for every matrix. Budget: each layer's divergence is measured with its
    matrices at the rank rule's rank (one-shot factors from the dense Grams), then one rank per
    layer is allocated from it under the same parameter budget (see :mod:`svdmlp.ranks`).
    """
    shapes = {
        (i, name): swap.dense_projection(model, spec, i, name) for i in indices for name in config.targets
    }
    if config.allocation == "uniform":
        planned: dict[int, dict[str, int]] = {i: {} for i in indices}
        for (index, name), linear in shapes.items():
            planned[index][name] = decompose.rank_for_keep(
                linear.in_features, linear.out_features, config.keep, config.align
            )
        return planned, {}
    return _allocate_ranks(model, tokenizer, spec, config, shapes, grams, calibration_text, progress)


def _allocate_ranks(model, tokenizer, spec, config, shapes, grams, calibration_text, progress):
    """One rank per layer from its measured divergence at the rank rule's rank (``shapes``: the
    dense projections by (layer, name)); the report's record of the probes and the choice."""
    started = time.perf_counter()
    indices = list(dict.fromkeys(index for index, _ in shapes))
    first = config.targets[0]  # a GLU MLP's matrices all cost hidden + intermediate per rank
    reference = {
        i: decompose.rank_for_keep(
            shapes[i, first].in_features, shapes[i, first].out_features, config.keep, config.align
        )
        for i in indices
    }
    spectra: dict[int, tuple[ranks.Spectrum, ...]] = {}

    def factorise(index: int) -> dict[str, decompose.Factors]:
        """The probe's factors at the reference rank, keeping the layer's spectra on the way (its
        whitenings stay with its Grams for the compression that follows)."""
        factors, layer_spectra = {}, []
        for name in config.targets:
            linear = shapes[index, name]
            decomposition = _decomposition(linear.weight, grams.get(index), name)
            factors[name] = decomposition.factors(reference[index])
            layer_spectra.append(
                ranks.Spectrum(
                    f"{index}.{name}", linear.in_features, linear.out_features, decomposition.energy
                )
            )
        spectra[index] = tuple(layer_spectra)
        return factors

    seq_len = min(SENSITIVITY_SEQ_LEN, config.calibration.seq_len)
    windows = _windows(tokenizer, config, calibration_text, SENSITIVITY_WINDOWS, seq_len, config.seed + 3)
    divergences = sensitivity.layer_divergences(model, spec, windows, factorise, indices, progress)
    layers = [ranks.LayerSensitivity(i, spectra[i], divergences[i], reference[i]) for i in indices]
    allocated = ranks.allocate_layer_ranks(layers, config.keep, config.align)
    info = {
        "method": "measured-sensitivity",
        "reference_keep": config.keep,
        "tokens": windows.numel(),
        "sha256": calibrate.tokens_hash(windows),
        "seconds": time.perf_counter() - started,
        "layers": [
            {
                "index": layer.index,
                "kl": layer.kl,
                "reference_rank": layer.reference_rank,
                "rank": allocated[layer.index],
                "predicted_kl": layer.predicted_kl(allocated[layer.index]),
            }
            for layer in layers
        ],
    }
    return {i: dict.fromkeys(config.targets, allocated[i]) for i in indices}, info


def _decomposition(
    weight: torch.Tensor, grams: calibrate.LayerGrams | None, name: str
) -> decompose.Decomposition:
    """Whitened by projection ``name``'s input Gram when the layer has calibration, plain otherwise."""
    return decompose.Decomposition.of(weight, None if grams is None else grams.whitening(name))


def _projection(weight: torch.Tensor, factors: decompose.Factors | None = None):
    """``x -> x·Wᵀ`` (or ``x·Uᵀ·Vᵀ`` with factors) in float32, for :func:`svdmlp.heal.down_grams`."""
    if factors is None:
        w_t = weight.detach().float().T
        return lambda x: x @ w_t
    u_t, v_t = factors.u.float().T, factors.v.float().T
    return lambda x: (x @ u_t) @ v_t


def _compress_layer(
    model: nn.Module,
    spec: arch.ArchSpec,
    index: int,
    ranks_by_name: dict[str, int],
    grams: calibrate.LayerGrams | None,
    inputs: list[torch.Tensor] | None = None,
) -> LayerRecord:
    """Factorise layer ``index``'s projections and swap them in.

    With the MLP's calibration ``inputs`` (closed-form healing), down is fitted last so that it
    compensates the error of the compressed gate and up (see :mod:`svdmlp.heal`).
    """
    factors, records = {}, []
    for name, rank in ranks_by_name.items():
        linear = swap.dense_projection(model, spec, index, name)
        weight = linear.weight
        factors[name] = _decomposition(weight, grams, name).factors(rank)
        gram = None if grams is None else grams.input_gram(name)
        healed = None
        if inputs is not None and name == "down":
            down_grams = _down_grams(model, spec, index, factors, inputs, gram)
            healed = heal.compensating_down(weight, down_grams, rank, factors[name])
            factors[name] = healed.factors
        error = decompose.weighted_relative_error(weight, factors[name], gram)
        keep = decompose.kept_fraction(linear.in_features, linear.out_features, rank)
        records.append(
            ProjectionRecord(
                name,
                linear.in_features,
                linear.out_features,
                rank,
                keep,
                error,
                heal_error_before=None if healed is None else healed.before,
                heal_error_after=None if healed is None else healed.after,
            )
        )
    dense = swap.dense_projection(model, spec, index, next(iter(ranks_by_name)))
    swap.install_lowrank(model, spec, index, ranks_by_name, dense.weight.dtype, dense.weight.device, factors)
    return LayerRecord(index, swap.mlp_name(spec, index), "compressed", projections=tuple(records))


def _down_grams(model, spec, index, factors, inputs, dense_gram) -> heal.DownGrams:
    """Grams of down's inputs with the dense and with the (already factorised) gate and up."""
    weights = {name: swap.dense_projection(model, spec, index, name).weight for name in ("gate", "up")}
    dense = tuple(_projection(weights[name]) for name in ("gate", "up"))
    compressed = tuple(_projection(weights[name], factors.get(name)) for name in ("gate", "up"))
    return heal.down_grams(inputs, dense, compressed, spec.activation, dense_gram)
