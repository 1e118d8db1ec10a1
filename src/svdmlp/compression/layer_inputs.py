"""What a model feeds its decoder layers, so that they can be run one at a time.

One forward pass with every decoder layer replaced by a recorder captures the hidden states entering
layer 0 and each layer's keyword arguments (position embeddings, attention masks: local and global
ones differ per layer in Gemma 2/3 and Qwen, position ids...). Layer-by-layer algorithms (sequential
calibration, the output-gradient Grams) then run each layer on hidden states of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn

from svdmlp import arch


@contextmanager
def stood_in(layers: nn.ModuleList, stand_ins: dict[int, nn.Module]) -> Iterator[None]:
    """Inside the block ``layers[i]`` is ``stand_ins[i]`` (a module that is not the layer loads nothing
    of a model on disk); every layer is back in its place after it, also when the block raises."""
    originals = list(layers)
    try:
        for index, module in stand_ins.items():
            layers[index] = module
        yield
    finally:
        for index, layer in enumerate(originals):
            layers[index] = layer


class _Captured(Exception):
    """Raised by the recorder of the last layer needed: the rest of the forward is not wanted."""


@dataclass
class Batch:
    """One batch of calibration windows on its way through the layers."""

    hidden: torch.Tensor  # (batch, seq, hidden): input of the current layer in the compressed model
    kwargs: list[dict]  # per decoder layer: the keyword arguments the model passes it


class _Recorder(nn.Module):
    """Stands in for a decoder layer during capture: records its inputs and computes nothing."""

    def __init__(self, index: int, last: int, sink: list[dict]):
        super().__init__()
        self.index, self.last, self.sink = index, last, sink

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        self.sink.append({"hidden": hidden_states, "kwargs": kwargs} if self.index == 0 else kwargs)
        if self.index == self.last:
            raise _Captured
        return hidden_states


@torch.no_grad()
def capture(
    model: nn.Module, spec: arch.ArchSpec, windows: torch.Tensor, last: int, batch_size: int
) -> list[Batch]:
    """Each batch's hidden states entering layer 0 and the kwargs of layers ``0..last``."""
    device = next(model.parameters()).device
    sink: list[dict] = []
    batches = []
    recorders = {index: _Recorder(index, last, sink) for index in range(last + 1)}
    with stood_in(arch.decoder_layers(model, spec), recorders):
        for batch in windows.split(batch_size):
            sink.clear()
            try:
                model(input_ids=batch.to(device), use_cache=False)
            except _Captured:
                pass
            hidden = sink[0]["hidden"]
            kwargs = [sink[0]["kwargs"], *sink[1:]]
            batches.append(Batch(hidden, kwargs))
    return batches


def run_layer(layer: nn.Module, hidden: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """A decoder layer's output hidden states (transformers 5 returns a tensor, older ones a tuple)."""
    output = layer(hidden, **kwargs)
    return output[0] if isinstance(output, tuple) else output


def input_gradient(
    layer: nn.Module, hidden: torch.Tensor, kwargs: dict, gradient: torch.Tensor
) -> torch.Tensor:
    """Run ``layer`` on ``hidden`` with gradients and take ``gradient`` at its output back to its input;
    the layer's parameters that require gradients accumulate theirs on the way."""
    given = hidden.detach().requires_grad_(True)
    with torch.enable_grad():
        run_layer(layer, given, kwargs).backward(gradient)
    return given.grad


class _Given(nn.Module):
    """Stands in for a decoder layer: the last one returns the given hidden states, the others pass theirs on."""

    def __init__(self, hidden: torch.Tensor | None):
        super().__init__()
        self.hidden = hidden

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        return hidden_states if self.hidden is None else self.hidden


@contextmanager
def head_only(model: nn.Module, spec: arch.ArchSpec, hidden: torch.Tensor) -> Iterator[None]:
    """Inside the block a forward pass of ``model`` takes ``hidden`` as the last decoder layer's output
    and runs only what follows it: the model's own final norm, head and logit transforms (softcapping),
    whatever the architecture."""
    layers = arch.decoder_layers(model, spec)
    last = len(layers) - 1
    with stood_in(layers, {index: _Given(hidden if index == last else None) for index in range(last + 1)}):
        yield


# Bytes of one float32 copy of the block of next-token logits formed at once (:func:`logits_by_rows`):
# 131 rows of a 152k vocabulary, where one whole (tokens, vocab) copy of a 512-token window is 311 MB and a
# loss's gradient needs about four. Each block re-reads the head's weight, so blocks much smaller cost
# time: on Qwen's 152k × 896 head (2 CPU cores), 32 rows took a window's head gradient 2.8x as long as
# whole logits, 128 rows 1.5x (BENCHMARKS.md, session 16).
LOGIT_BLOCK_BYTES = 80 * 10**6


def block_rows(vocab: int, batch: int = 1) -> int:
    """Token positions per block of logits (:data:`LOGIT_BLOCK_BYTES` over ``batch`` windows)."""
    return max(1, LOGIT_BLOCK_BYTES // (vocab * 4 * batch))


def head_gradient(
    model: nn.Module, spec: arch.ArchSpec, hidden: torch.Tensor, loss
) -> tuple[float, torch.Tensor]:
    """A loss of the last decoder layer's output ``hidden`` and its gradient there, for a loss that is
    a sum over token positions: ``loss(logits, positions)`` is the part of it from those positions.

    The head runs on a block of rows at a time (:func:`block_rows`), so the logits of all tokens are never whole
    in memory (a 512-token window of a 152k vocabulary: 311 MB per float32 copy; distillation's step
    of a 1.5B model rose 1.6 GB above the rest of it there, the calibration's Fisher of the 0.5B model
    about 1 GB). Only the output embedding is read: the input goes in as embeddings.
    """
    given = hidden.detach().requires_grad_(True)
    total = 0.0
    with head_only(model, spec, given), torch.enable_grad():
        for positions, logits in logits_by_rows(model, given):
            part = loss(logits, positions)
            part.backward()
            total += float(part.detach())
    return total, given.grad


def logits_by_rows(model: nn.Module, hidden: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Inside :func:`head_only` for ``hidden``: ``(positions, logits)`` of a block of rows (:func:`block_rows`)
    of tokens at a time, in order, from the model's own final norm, head and logit transforms."""
    step = block_rows(model.get_output_embeddings().out_features, hidden.shape[0])
    for start in range(0, hidden.shape[1], step):
        positions = torch.arange(start, min(start + step, hidden.shape[1]), device=hidden.device)
        # inputs_embeds: the embedding is neither read nor used; the stand-in layers return ``hidden``
        yield positions, model(inputs_embeds=hidden, use_cache=False, logits_to_keep=positions).logits
