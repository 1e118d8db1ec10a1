"""Factorisation: every layer to compress becomes low-rank factors at its planned ranks, one layer at a
time. Sequential calibration walks the windows through the layers, each calibrated on the outputs of the
compressed layers before it (with closed-form healing of down where asked); one-shot factorising uses
the dense Grams, made in the walk or given. A model on disk writes each compressed layer to its file
once it has run on the windows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from svdmlp import lazy
from svdmlp.compression import factorise as factorise_layer
from svdmlp.compression import sequential
from svdmlp.compression.calibration import source_weights, tokens_hash
from svdmlp.compression.report import LayerRecord
from svdmlp.compression.steps import sizes
from svdmlp.compression.steps.context import Run
from svdmlp.compression.steps.sizes import F64, Sizes


def factorise(run: Run, on_stored: Callable[[LayerRecord, Path], None] | None = None) -> list[LayerRecord]:
    """Compress every planned layer not in ``run.records`` (those a stopped run did are installed
    already); each layer's record handed to ``on_stored`` with its file once it is on disk. The record
    of every decoder layer, compressed or skipped."""
    config, model, clock = run.config, run.model, run.clock

    def stored(index: int | None) -> None:
        """Layer ``index`` has run on the calibration windows: written to disk, dropped, handed on."""
        path = run.store(index)
        if index is not None and on_stored is not None:
            on_stored(run.records[index], path)

    layer_by_layer = config.sequential or (config.needs_calibration and not run.grams)
    if layer_by_layer and run.to_compress:
        run.grams.clear()  # only the ranks came from the dense Grams
        clock.switch("calibration")  # the walk to each layer, each layer's Grams
        tokens = run.windows()
        walk = sequential.calibrated_layers(
            model,
            run.spec,
            tokens,
            sorted(set(run.planned) - set(run.records)),
            keep_inputs=config.heals_closed_form,
            progress=run.progress,
            dense=not config.sequential,
        )
        previous = None
        for index, layer_grams, inputs in walk:
            clock.switch("factorisation")
            stored(previous)
            layer_grams.outputs = run.outputs.get(index)  # the dense model's: a one-shot approximation
            layer_grams.keep_whitenings = run.in_memory  # a big model's: one at a time
            run.records[index] = factorise_layer.layer(
                model, run.spec, index, run.planned[index], layer_grams, inputs
            )
            run.discard_outputs(index)
            del layer_grams, inputs  # before the walk makes the next layer's
            previous = index
            clock.switch("calibration")
        clock.switch("factorisation")
        stored(previous)
        run.calibration_info = {
            "tokens": tokens.numel(),
            "sha256": tokens_hash(tokens),
            "sources": source_weights(config, run.calibration_text),
            **({"sequential": True} if config.sequential else {}),
        }
    records = []
    for index, name in enumerate(run.mlp_names):
        if index not in run.selected:
            records.append(LayerRecord(index, name, "skipped", "not selected by config.layers"))
        elif run.skip[index]:
            records.append(LayerRecord(index, name, "skipped", run.skip[index]))
        elif index in run.records:
            records.append(run.records[index])
        else:
            with lazy.held(model, run.layers[index]):  # each layer's Grams freed as soon as it is done
                grams = run.grams.pop(index, None)
                run.records[index] = factorise_layer.layer(model, run.spec, index, run.planned[index], grams)
            records.append(run.records[index])
            stored(index)
            run.discard_outputs(index)
    return records


def cost(s: Sizes) -> tuple[float, float]:
    """(peak bytes, seconds) of factorising the layers."""
    h, i, speed, config = s.h, s.i, s.speed, s.config
    if not config.needs_calibration:
        return s.model + s.layer + sizes.svd_bytes(h, i), s.compressed * 3 * 4 * h * h * i / speed.f64
    # A layer's peak: decomposing a projection beside its input Grams, or closed form's Gram of the
    # compressed intermediate (which becomes its own root) and W·Cᵀ, a strip of their update, and the
    # MLP's inputs.
    closed_form = 0.0
    if config.heals_closed_form:
        closed_form = (i * i + h * i) * F64 + sizes.strip_bytes(i) + s.hidden_states
    memory = s.per_layer + max(s.decomposing, closed_form)
    # Closed form: its inter² Gram and root, W·Cᵀ from the dense outputs W·h (two hidden × inter
    # products a token), the triangular solve, the target and two errors through inter² matrices (about
    # 5·h·i² in float64).
    closed = s.tokens * 4 * h * i / speed.f32 + s.grams(i) + speed.root(i) + 5 * h * i * i / speed.f64
    # The walk runs each layer dense for its Grams and, sequential, again once compressed, to carry on.
    rerun = 2 * s.compressed * s.compressed_layer * s.tokens if config.sequential else 0
    per_layer = s.factorise + (closed if config.heals_closed_form else 0)
    return memory, (s.walk + rerun) / speed.f32 + s.compressed * per_layer
