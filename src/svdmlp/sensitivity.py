"""Measured sensitivity: what factorising one layer's MLP alone does to the model's predictions.

For each layer, its MLP projections are replaced in place by their low-rank reconstructions ``V·U``
(same shape, so nothing else changes), the model scores a few calibration windows, and the weights
are put back, also when the forward fails. The divergence is the KL from the dense model's
next-token distribution, ``Σ p·(log p − log q)`` averaged over tokens, in nats per token.

The layers before the probed one compute exactly what they computed in the dense pass, so they
replay their recorded outputs instead (about 40% of SmolLM2's probe forward passes on average).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from svdmlp import arch, swap
from svdmlp.decompose import Factors


@contextmanager
def _reconstructed(
    model: nn.Module, spec: arch.ArchSpec, index: int, factors: dict[str, Factors]
) -> Iterator:
    """Layer ``index``'s projections hold ``V·U`` inside the block and their own weights after it."""
    originals = {}
    try:
        for name, pair in factors.items():
            weight = swap.dense_projection(model, spec, index, name).weight
            originals[name] = weight.data
            weight.data = (
                pair.v.to(weight.device, torch.float32) @ pair.u.to(weight.device, torch.float32)
            ).to(weight.dtype)
        yield
    finally:
        for name, data in originals.items():
            swap.dense_projection(model, spec, index, name).weight.data = data


def _log_probs(model: nn.Module, windows: torch.Tensor) -> list[torch.Tensor]:
    device = next(model.parameters()).device
    return [
        F.log_softmax(model(input_ids=batch.to(device), use_cache=False).logits.float(), dim=-1)
        for batch in windows.split(1)
    ]


@contextmanager
def _recorded(layers: list[nn.Module]) -> Iterator[list[list]]:
    """Inside the block, each decoder layer's output per forward pass is appended to its list."""
    outputs = [[] for _ in layers]
    handles = [
        layer.register_forward_hook(lambda module, args, output, kept=kept: kept.append(output))
        for layer, kept in zip(layers, outputs, strict=True)
    ]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _replayed(layers: list[nn.Module], outputs: list[list]) -> Iterator[None]:
    """Inside the block, ``layers[j]`` returns ``outputs[j]`` one forward pass after another
    without computing anything; its own ``forward`` is back after the block."""
    try:
        for layer, kept in zip(layers, outputs, strict=True):
            replay = iter(kept)
            layer.forward = lambda *args, replay=replay, **kwargs: next(replay)
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


@torch.no_grad()
def layer_divergences(
    model: nn.Module,
    spec: arch.ArchSpec,
    windows: torch.Tensor,
    factorise: Callable[[int], dict[str, Factors]],
    indices: list[int],
    progress: bool = True,
) -> dict[int, float]:
    """KL (nats/token) from the dense model to the model with only layer ``i`` factorised, for each ``i``.

    Args:
        windows: token windows ``(num_windows, seq_len)`` to score.
        factorise: ``index -> {projection name: factors}`` for the layer to probe.
    """
    layers = list(arch.decoder_layers(model, spec))
    with _recorded(layers) as outputs:
        dense = _log_probs(model, windows)
    tokens = windows.numel()
    divergences = {}
    for index in tqdm(indices, desc="sensitivity", unit="layer", disable=not progress):
        with _reconstructed(model, spec, index, factorise(index)), _replayed(layers[:index], outputs[:index]):
            probed = _log_probs(model, windows)
        total = sum(float((p.exp() * (p - q)).sum()) for p, q in zip(dense, probed, strict=True))
        divergences[index] = total / tokens
    return divergences
