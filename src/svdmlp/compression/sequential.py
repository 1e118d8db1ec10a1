"""Sequential calibration: compress decoder layers in order, each on the outputs of those before it.

One-shot calibration takes every layer's Grams from the dense model, so no layer can compensate for
the error of the compressed layers before it, and the errors compound through the depth. Here layer
``i`` is calibrated on the hidden states that the *already compressed* layers ``0..i-1`` produce
(as SVD-LLM and llm-compressor do). Memory stays at about one layer's activations for the
calibration set: the hidden states entering the current layer (and, for closed-form healing, the
inputs of its MLP), never the whole model's.

How: one forward pass with every decoder layer replaced by a recorder captures what the model feeds
its layers (the hidden states entering layer 0, and each layer's keyword arguments: position
embeddings, attention masks (local and global ones differ per layer in Gemma 2/3 and Qwen), position
ids...). Then, for each layer: run it on the current hidden states with taps on its MLP's inputs,
accumulate the Grams, hand them to the caller (who compresses the MLP in place), and run the now
compressed layer to produce the next hidden states. The caller drives: :func:`calibrated_layers` is a
generator, so it never calls back into the code that compresses.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from svdmlp import arch, lazy, lowrank, runtime
from svdmlp.compression.calibration import LayerGrams
from svdmlp.compression.gram import accumulate_gram
from svdmlp.compression.layer_inputs import Batch, capture, run_layer


class _Taps:
    """Forward pre-hooks keeping the latest inputs of an MLP and of its down projection."""

    def __init__(self, mlp: nn.Module, down: nn.Module):
        self.mlp_input = self.down_input = None
        self._handles = [
            mlp.register_forward_pre_hook(lambda module, args: setattr(self, "mlp_input", args[0])),
            down.register_forward_pre_hook(lambda module, args: setattr(self, "down_input", args[0])),
        ]

    def __enter__(self) -> _Taps:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()


@torch.no_grad()
def _calibrate_layer(
    layer: nn.Module,
    spec: arch.ArchSpec,
    batches: list[Batch],
    index: int,
    keep_inputs: bool,
    carry: bool = False,
) -> tuple[LayerGrams, list[torch.Tensor] | None]:
    """Grams of layer ``index``'s (still dense) MLP on the compressed model's inputs, and with
    ``keep_inputs`` the MLP's input batches themselves; with ``carry`` each batch's hidden states
    become the layer's output as soon as it is made, so that its input is freed with it."""
    mlp = getattr(layer, spec.mlp)
    down = getattr(mlp, spec.down)
    hidden, inter = getattr(mlp, spec.gate).in_features, down.in_features
    grams = LayerGrams.zeros(hidden, inter, down.weight.device)
    inputs = [] if keep_inputs else None
    with _Taps(mlp, down) as taps:
        for batch in batches:
            output = run_layer(layer, batch.hidden, batch.kwargs[index])
            if carry:
                batch.hidden = output
            accumulate_gram(grams.gate_up, taps.mlp_input)
            accumulate_gram(grams.down, taps.down_input)
            grams.tokens += taps.mlp_input.numel() // hidden
            if keep_inputs:
                inputs.append(taps.mlp_input)
    return grams, inputs


def calibrated_layers(
    model: nn.Module,
    spec: arch.ArchSpec,
    windows: torch.Tensor,
    indices: list[int],
    keep_inputs: bool = False,
    batch_size: int = 4,
    progress: bool = True,
    dense: bool = False,
) -> Iterator[tuple[int, LayerGrams, list[torch.Tensor] | None]]:
    """Yield ``(index, grams, inputs)`` for layers ``indices`` in order, each calibrated on the model as
    the caller has compressed it so far.

    The caller compresses layer ``index``'s MLP in place before asking for the next item; the layer
    then runs as it is to produce the hidden states the next layers are calibrated on.

    Args:
        windows: calibration tokens ``(num_samples, seq_len)``.
        indices: decoder layers to calibrate; the others only carry the hidden states forward.
        keep_inputs: also yield the MLP's input batches (closed-form healing refits down on them);
            otherwise ``inputs`` is None.
        dense: carry the dense layers' outputs forward whatever the caller does to them: each
            layer is calibrated on the dense model (one-shot calibration, one layer at a time).
    """

    def calibrate(layer, batches, index, carry):
        return _calibrate_layer(layer, spec, batches, index, keep_inputs, carry)

    desc = "one-shot" if dense else "sequential"
    for index, (grams, inputs) in _walk(
        model, spec, windows, indices, calibrate, batch_size, progress, desc, dense
    ):
        yield index, grams, inputs
        del grams, inputs


def lowrank_inputs(
    model: nn.Module,
    spec: arch.ArchSpec,
    windows: torch.Tensor,
    indices: list[int],
    batch_size: int = 4,
    progress: bool = True,
) -> Iterator[tuple[int, dict[nn.Module, list[torch.Tensor]]]]:
    """Yield ``(index, inputs)`` for compressed layers ``indices`` in order: every low-rank module of the
    layer and its input batches, on the model as the caller has changed it so far (as
    :func:`calibrated_layers`, whose walk it shares: the caller changes the layer before the next item)."""

    def taps(layer, batches, index, _carry):  # not a dense walk: never asked to carry
        inputs = {module: [] for module in lowrank.lowrank_modules(layer)}
        handles = [
            module.register_forward_pre_hook(lambda module, args: inputs[module].append(args[0]))
            for module in inputs
        ]
        try:
            for batch in batches:
                run_layer(layer, batch.hidden, batch.kwargs[index])
        finally:
            for handle in handles:
                handle.remove()
        return inputs

    yield from _walk(model, spec, windows, indices, taps, batch_size, progress, "quantization", False)


def _walk(model, spec, windows, indices, visit, batch_size, progress, desc, dense):
    """Carry the calibration windows through the decoder layers, yielding ``(index, visit(layer,
    batches, index, carry))`` at each of ``indices`` before running the layer on.

    ``dense``: carry the dense layer's outputs, which ``visit`` (told to ``carry``) puts in the batches
    in place of their inputs as it runs the layer, before the caller changes it: each layer runs once,
    and the windows' hidden states are in memory once, not as inputs and outputs (0.7 GB each for
    Qwen2.5-Coder-1.5B's 224 windows of 513 tokens). Otherwise the layer runs again, as the caller
    left it.

    Its work runs without autograd, in blocks that end before each ``yield``: ``@torch.no_grad()`` on a
    generator keeps the last item it yielded until the next is made, so one layer's Grams (0.64 GB at
    Qwen2.5-Coder-1.5B's width) would stay alive beside the next layer's."""
    if not indices:
        return
    layers = arch.decoder_layers(model, spec)
    last = max(indices)
    batches = capture(model, spec, windows, last, batch_size)  # itself without autograd
    wanted = set(indices)
    for index in tqdm(range(last + 1), desc=desc, unit="layer", disable=not progress):
        layer = layers[index]
        with lazy.held(model, layer):  # loaded once for calibration, compression and the run
            carried = dense and index in wanted and index < last
            if index in wanted:
                with torch.no_grad():
                    visited = visit(layer, batches, index, carried)
                runtime.trim_heap()  # what running the layer freed, before the caller's long work
                yield index, visited
                del visited  # before the next layer's is made
            if index == last:
                break  # nothing after the last compressed layer needs its inputs
            if not carried:
                with torch.no_grad():
                    for batch in batches:
                        batch.hidden = run_layer(layer, batch.hidden, batch.kwargs[index])
