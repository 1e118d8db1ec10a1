"""Calibration: the dense model's Grams that the later steps need up front. The output-gradient Grams of
the ``fisher`` method (one forward and backward pass over the windows: a backward pass needs the whole
model), and, for one-shot factorising of a model in memory after budget allocation, its input Grams,
which the probes then reuse. Every other input Gram is made one layer at a time, in its layer's turn."""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from svdmlp import lazy
from svdmlp.compression.calibration import Calibration, source_weights
from svdmlp.compression.gram import GRAM_ROWS
from svdmlp.compression.steps import sizes
from svdmlp.compression.steps.context import Run
from svdmlp.compression.steps.sizes import F32, F64, LOGIT_COPIES, Sizes
from svdmlp.config import CompressConfig


def _reuses_probes(run: Run) -> bool:
    """One-shot factorising of a model in memory after budget allocation reuses the probes' Grams."""
    return not run.config.sequential and run.config.allocation == "budget" and run.in_memory


def needed(run: Run) -> bool:
    config = run.config
    wanted = config.needs_output_grams or _reuses_probes(run) and config.needs_calibration
    return wanted and bool(run.to_compress)


def collect(run: Run, inputs: bool | None = None, spill: Path | None = None) -> Calibration:
    """This run's calibration (the input Grams too where ``inputs``, by default where the probes reuse
    them); kept in ``spill``, or beside a model on disk's layers."""
    weights = lazy.of(run.model)
    if spill is None and weights is not None:  # a model on disk: its Grams on disk too
        spill = weights.scratch
    config = run.config
    return Calibration.collect(
        run.model,
        run.spec,
        run.windows(),
        run.to_compress,
        run.progress,
        source_weights(config, run.calibration_text),
        config.needs_output_grams,
        config.seed,
        _reuses_probes(run) if inputs is None else inputs,
        spill,
    )


def use(run: Run, calibration: Calibration | None) -> None:
    """Take the Grams the later steps need from ``calibration`` (collected by this run, recorded by a
    stopped one, or given: a sweep's); a ValueError when it lacks some."""
    config, to_compress = run.config, run.to_compress
    if calibration is None or not config.needs_calibration or not to_compress:
        return
    missing = sorted(set(to_compress) - set(calibration.grams))
    if missing and calibration.grams and not config.sequential:
        raise ValueError(f"the calibration given has no Grams for layers {missing}")
    if config.needs_output_grams and set(to_compress) - set(calibration.outputs):
        raise ValueError("the calibration given has no output-gradient Grams, which method 'fisher' needs")
    run.grams = {i: calibration.grams[i] for i in to_compress if i in calibration.grams}  # popped as used
    run.outputs = calibration.outputs
    run.calibration_info = calibration.info


def shared(model: nn.Module, config: CompressConfig) -> bool:
    """Whether :func:`collect_shared` has anything for compressions of ``model`` to share: the
    output-gradient Grams, or a model in memory's input Grams."""
    return config.needs_output_grams or (config.needs_dense_grams and lazy.of(model) is None)


def collect_shared(run: Run, spill: Path | None = None) -> Calibration:
    """The Grams compressing ``run``'s model with its config needs at any keep, to share between
    compressions (a sweep's keeps): a model in memory gets every Gram it uses, a model on disk only the
    output-gradient Grams, kept in ``spill`` (its input Grams are made one layer at a time by each
    compression)."""
    return collect(run, run.config.needs_dense_grams and run.in_memory, spill)


def cost(s: Sizes) -> tuple[float, float] | None:
    """(peak bytes, seconds) of collecting the output-gradient Grams; None without them."""
    if not s.config.needs_calibration or not s.config.needs_output_grams:
        return None
    h, i, vocab = s.h, s.i, s.shapes.vocab
    # The head's gradient: the output embedding and a few rows of logits at a time
    # (layer_inputs.head_gradient), beside the windows' hidden states and their gradients.
    head = vocab * h * F32 + sizes.logit_block(s.window, vocab) * LOGIT_COPIES
    # A layer of the backward pass holds its output-gradient Grams. While the windows run back
    # through it, one at a time: the gradients at its output (going) and at its input (coming), two
    # copies of the hidden states, the gradients' rows waiting for their Grams' update, a strip of
    # that update and one window's autograd record. Then each Gram's float32 copy as it is spilled,
    # beside the input gradients.
    running = (
        2 * s.hidden_states
        + GRAM_ROWS * (2 * i + h) * F32
        + sizes.strip_bytes(i)
        + sizes.layer_record(s.shapes, s.window)
    )
    spilling = s.hidden_states + i * i * F32
    output_grams = (2 * i * i + h * h) * F64
    memory = s.model + max(2 * s.hidden_states + head, s.layer + output_grams + max(running, spilling))
    return memory, 3 * s.forward / s.speed.f32 + s.compressed * s.grams(i, i, h)
