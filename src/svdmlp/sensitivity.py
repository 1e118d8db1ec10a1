"""Measured sensitivity: what factorising one layer's MLP alone does to the model's predictions.

For each layer, its MLP projections are replaced in place by their low-rank reconstructions ``V·U``
(same shape, so nothing else changes), the model scores a few calibration windows, and the weights
are put back, also when the forward fails. The divergence is the KL from the dense model's
next-token distribution, ``Σ p·(log p − log q)`` averaged over tokens, in nats per token.
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
    dense = _log_probs(model, windows)
    tokens = windows.numel()
    divergences = {}
    for index in tqdm(indices, desc="sensitivity", unit="layer", disable=not progress):
        with _reconstructed(model, spec, index, factorise(index)):
            probed = _log_probs(model, windows)
        total = sum(float((p.exp() * (p - q)).sum()) for p, q in zip(dense, probed, strict=True))
        divergences[index] = total / tokens
    return divergences
