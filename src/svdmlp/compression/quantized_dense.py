"""A dense model's MLP weights rounded by GPTQ on calibration windows, in place: the calibrated baseline
that compression is compared with (:mod:`svdmlp.quantize` rounds to nearest), and with a low-rank
correction of each weight's rounding error beside it (:mod:`svdmlp.compression.correction`), what
``svdmlp compress --quantize`` stores.

For evaluation (:func:`quantize_dense_mlps`) the quantization is fake: each weight is replaced by the value
its integers stand for, which is what an int8/int4 kernel would multiply by; the bytes counted are the
packed ones. For a checkpoint (:func:`store_quantized_mlps`) each projection becomes a
:class:`~svdmlp.quantized_linear.QuantizedLinear` holding the packed integers. Either way layers go one
at a time, each on the hidden states of the layers before it as already rounded
(:func:`sequential.calibrated_layers`): gate and up with the Gram of the MLP's input, down with the Gram
of its own input. A model on disk has each layer written back once rounded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from svdmlp import arch, lazy
from svdmlp.compression import correction_ranks, sequential
from svdmlp.compression.calibration import config_windows, tokens_hash
from svdmlp.compression.correction import CORRECTION_ROUNDS, Corrected, corrected
from svdmlp.compression.report import LayerRecord, ProjectionRecord
from svdmlp.config import CompressConfig
from svdmlp.int_weights import FakeQuantization, Scheme, factor_scheme, gptq, scheme
from svdmlp.quantized_linear import QuantizedLinear
from svdmlp.ranks import rank_for_keep

# What each rounded projection is handed to: (layer index, its MLP, projection name, the dense linear,
# its rounding with the correction or None, the input Gram).
Place = Callable[[int, nn.Module, str, nn.Linear, Corrected, torch.Tensor], None]
# What each layer is handed to once all its projections are placed and it is written back: (its index, the
# file it is in now; None for a model in memory).
Finished = Callable[[int, Path | None], None]


@torch.no_grad()
def _round_mlps(
    model: nn.Module,
    tokenizer,
    how: Scheme,
    config: CompressConfig,
    correction_keep: float,
    rounds: int,
    progress: bool,
    place: Place,
    done: frozenset[int] = frozenset(),
    finished: Finished | None = None,
    allocated: dict[int, int] | None = None,
) -> dict:
    """Round every MLP projection of ``model`` by GPTQ layer by layer, each with its correction when
    ``correction_keep`` > 0 (of the rank rule's rank, or of each layer's ``allocated`` rank,
    :func:`allocate_corrections`), and hand each to ``place``, then the layer to ``finished``; the layers
    ``done`` (a stopped run's, installed as rounded) only carry the hidden states forward. Returns the
    calibration tokens used (count, SHA-256)."""
    spec = arch.of_model(model)
    windows = _windows(model, tokenizer, config)
    layers = arch.decoder_layers(model, spec)
    todo = [index for index in range(len(layers)) if index not in done]
    walk = sequential.calibrated_layers(model, spec, windows, todo, progress=progress)
    for index, grams, _ in walk:
        mlp = getattr(layers[index], spec.mlp)
        for projection in arch.PROJECTIONS:
            linear = getattr(mlp, spec.projection(projection))
            weight, gram = linear.weight, grams.input_gram(projection)
            if allocated is not None:
                rank = allocated[index]
            elif correction_keep:
                rank = rank_for_keep(weight.shape[1], weight.shape[0], correction_keep, config.align)
            else:
                rank = 0
            if rank:
                fixed = corrected(weight, gram, grams.whitening(projection), how, rank, rounds)
            else:
                fixed = Corrected(*gptq(weight.float(), gram, how, return_zeros=True), None)
            place(index, mlp, projection, linear, fixed, gram)
        path = lazy.store(model, layers[index])  # held by the walk, which runs it on as rounded
        if finished is not None:
            finished(index, path)
        del grams  # before the walk makes the next layer's
    return {"calibration_tokens": windows.numel(), "calibration_sha256": tokens_hash(windows)}


def _windows(model: nn.Module, tokenizer, config: CompressConfig) -> torch.Tensor:
    """The calibration windows ``config`` names, drawn as ``svdmlp compress`` draws them."""
    return config_windows(tokenizer, config, None, bos=arch.bos_token_id(arch.of_model(model), tokenizer))


@torch.no_grad()
def allocate_corrections(
    model: nn.Module, tokenizer, name: str, config: CompressConfig, keep: float, progress: bool = True
) -> tuple[dict[int, int], dict]:
    """Each layer's correction rank for the dense ``model`` rounded by the scheme ``name``, within the
    budget of a correction keeping ``keep``, from its measured divergence on ``config``'s calibration
    (:mod:`~svdmlp.compression.correction_ranks`); and the report's record."""
    windows = _windows(model, tokenizer, config)
    return correction_ranks.allocate(model, tokenizer, scheme(name), config, keep, windows, progress)


@torch.no_grad()
def quantize_dense_mlps(
    model: nn.Module,
    tokenizer,
    name: str,
    config: CompressConfig | None = None,
    progress: bool = True,
    correction_keep: float = 0.0,
    rounds: int = CORRECTION_ROUNDS,
    correction_bits: int = 16,
    allocate: bool = False,
) -> dict:
    """Round every MLP weight of the dense ``model`` by GPTQ (scheme ``name``) on the calibration windows
    ``config`` names (default: what ``svdmlp compress`` draws with no flag), as fake quantization; what it
    cost, as :func:`svdmlp.quantize.quantize_mlp` reports it, and the calibration tokens used.

    With ``correction_keep`` > 0, each weight keeps a low-rank correction of its rounding error
    (:mod:`svdmlp.compression.correction`) of the rank that keeps that fraction of its parameters (the
    rank rule of ``--keep``, aligned to ``config.align``), its factors in bf16 or rounded to
    ``correction_bits`` 8 or 4 as ``--factor-bits`` rounds factors, counted in the MLP's bytes;
    quantization and correction solved in turn ``rounds`` times. With ``allocate``, each layer's rank is
    allocated from measured divergence within the same budget (:mod:`~svdmlp.compression.correction_ranks`)."""
    how, factors_how = scheme(name), factor_scheme(correction_bits)
    tally = FakeQuantization(how)

    def place(index, mlp, projection, linear, fixed: Corrected, gram) -> None:
        correction = None if fixed.correction is None else (fixed.correction.v, fixed.correction.u)
        tally.replace(linear.weight, fixed.q, fixed.scales, correction, factors_how)

    config = config or CompressConfig()
    allocated, allocation = None, {}
    if allocate and correction_keep:
        allocated, allocation = allocate_corrections(
            model, tokenizer, name, config, correction_keep, progress
        )
    digest = _round_mlps(
        model, tokenizer, how, config, correction_keep, rounds, progress, place, allocated=allocated
    )
    correction = _correction_record(correction_keep, rounds, correction_bits)
    allocation = {"allocation": allocation} if allocation else {}
    return {**tally.report(), "method": "gptq", **correction, **allocation, **digest}


@torch.no_grad()
def store_quantized_mlps(
    model: nn.Module,
    tokenizer,
    config: CompressConfig,
    progress: bool = True,
    rounds: int = CORRECTION_ROUNDS,
    done: dict[int, tuple[LayerRecord, dict]] | None = None,
    on_stored: Callable[[LayerRecord, Path | None, dict], None] | None = None,
    allocated: dict[int, int] | None = None,
) -> tuple[list[LayerRecord], dict]:
    """Replace every MLP projection of the dense ``model`` by a :class:`QuantizedLinear` of its weight,
    rounded by GPTQ (``config.quantize``) with the correction ``config.correction_keep`` asks for, its
    factors in the weight's dtype until saved, or quantized as ``config.factor_bits`` says. Returns each
    layer's record (the corrections' ranks, keeps and output errors ``‖(W − Q − V·U)·Xᵀ‖ / ‖W·Xᵀ‖`` on the
    calibration inputs) and the quantization's (as :func:`quantize_dense_mlps` reports it).

    A stopped run's layers, installed as stored, come in ``done`` with their records and tallies
    (:meth:`~svdmlp.int_weights.FakeQuantization.counts`); each layer made here goes to ``on_stored`` with
    its file and tally once it is written. ``allocated``: each layer's correction rank
    (:func:`allocate_corrections`; default the rank rule's at ``config.correction_keep``)."""
    how, factors_how = scheme(config.quantize), factor_scheme(config.factor_bits)
    done = done or {}
    total = FakeQuantization(how)  # counts the bytes and errors; the model gets the packed form
    for _, counts in done.values():
        total.add(counts)
    records = {index: record for index, (record, _) in done.items()}
    spec = arch.of_model(model)
    layer, projections = FakeQuantization(how), []

    def place(index, mlp, projection, linear, fixed: Corrected, gram) -> None:
        weight, correction = linear.weight.float(), fixed.correction
        pair = None if correction is None else (correction.v, correction.u)
        value = weight.clone()  # becomes what the stored module stands for
        layer.replace(value, fixed.q, fixed.scales, pair, factors_how)
        error = output_error(weight, value, gram)
        rounding = (fixed.q, fixed.scales, fixed.zeros)
        module = QuantizedLinear.rounded(linear, how, rounding, correction, factors_how=factors_how)
        setattr(mlp, spec.projection(projection), module)
        if correction is not None:
            n_out, n_in = weight.shape
            keep = correction.rank * (n_in + n_out) / (n_in * n_out)
            projections.append(ProjectionRecord(projection, n_in, n_out, correction.rank, keep, error))

    def finished(index: int, path: Path | None) -> None:
        nonlocal layer
        records[index] = LayerRecord(
            index, arch.mlp_name(spec, index), "quantized", projections=tuple(projections)
        )
        total.add(layer.counts())
        if on_stored is not None:
            on_stored(records[index], path, layer.counts())
        layer, projections[:] = FakeQuantization(how), []

    digest = _round_mlps(
        model,
        tokenizer,
        how,
        config,
        config.correction_keep,
        rounds,
        progress,
        place,
        frozenset(done),
        finished,
        allocated,
    )
    correction = _correction_record(config.correction_keep, rounds, config.factor_bits)
    return [records[index] for index in sorted(records)], {
        **total.report(),
        "method": "gptq",
        **correction,
        **digest,
    }


def _correction_record(keep: float, rounds: int, bits: int) -> dict:
    """What a quantization's record says of its correction (nothing when there is none)."""
    if not keep:
        return {}
    return {
        "correction_keep": keep,
        "correction_rounds": rounds,
        **({"correction_bits": bits} if bits != 16 else {}),
    }


def output_error(weight: torch.Tensor, value: torch.Tensor, gram: torch.Tensor) -> float:
    """``‖(W − value)·Xᵀ‖ / ‖W·Xᵀ‖`` from the Gram ``XᵀX`` of the inputs."""
    gram = gram.double()
    error = (weight - value).double()
    squared = torch.einsum("ij,jk,ik->", error, gram, error)
    reference = torch.einsum("ij,jk,ik->", weight.double(), gram, weight.double())
    return float((squared.clamp_min(0) / reference.clamp_min(1e-300)).sqrt())
