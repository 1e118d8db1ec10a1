"""Replace MLP module instances by their low-rank versions, by name (never patching classes)."""

from __future__ import annotations

import torch
import torch.nn as nn

from svdmlp import arch
from svdmlp.config import PROJECTIONS
from svdmlp.decompose import Factors
from svdmlp.modules import LowRankGatedMLP, LowRankLinear


def mlp_name(spec: arch.ArchSpec, index: int) -> str:
    """Fully qualified module name of decoder layer ``index``'s MLP, e.g. ``model.layers.3.mlp``."""
    return f"{spec.layers}.{index}.{spec.mlp}"


def dense_projection(model: nn.Module, spec: arch.ArchSpec, index: int, name: str) -> nn.Linear:
    """The (still dense) ``nn.Linear`` of projection ``name`` in layer ``index``."""
    mlp = getattr(arch.decoder_layers(model, spec)[index], spec.mlp)
    return getattr(mlp, spec.projection(name))


def install_lowrank(
    model: nn.Module,
    spec: arch.ArchSpec,
    index: int,
    ranks: dict[str, int],
    dtype: torch.dtype,
    device: torch.device | str,
    factors: dict[str, Factors] | None = None,
) -> None:
    """Swap layer ``index``'s MLP (all three projections) or the named projections for low-rank ones.

    With ``factors`` the new modules are filled from them; without, they stay uninitialised (the
    skeleton that a checkpoint load fills in place, typically on the meta device).
    """
    layer = arch.decoder_layers(model, spec)[index]
    mlp = getattr(layer, spec.mlp)
    if set(ranks) == set(PROJECTIONS):
        gate = getattr(mlp, spec.gate)
        fused = LowRankGatedMLP(gate.in_features, gate.out_features, ranks, spec.activation, dtype, device)
        if factors is not None:
            fused.load_factors(factors)
        setattr(layer, spec.mlp, fused)
        return
    for name, rank in ranks.items():
        dense = getattr(mlp, spec.projection(name))
        lowrank = LowRankLinear(dense.in_features, dense.out_features, rank, dtype, device)
        if factors is not None:
            lowrank.load_factors(factors[name])
        setattr(mlp, spec.projection(name), lowrank)
