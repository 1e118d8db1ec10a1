"""Closed-form healing: fit each down projection so that it compensates the gate/up error.

Factorising gate and up changes what the down projection reads: ``h̃ = act(gate'(x))·up'(x)``
instead of ``h = act(gate(x))·up(x)``. Whitened SVD of down on the Gram of ``h`` approximates
``W·h`` well *for inputs ``h``*, but at run time it gets ``h̃``. The rank-r ``M`` that minimises the
error that matters,

    ‖W·Hᵀ − M·H̃ᵀ‖_F   (rows of H, H̃: the calibration tokens' h and h̃),

is a reduced-rank regression with a closed form: with ``G = H̃ᵀH̃`` and ``C = H̃ᵀH``, the
unconstrained optimum is ``M₀ = W·Cᵀ·G⁻¹`` and the rank-r optimum is the whitened SVD of ``M₀``
on ``G`` (expand the square: ``‖M·S − M₀·S‖_F`` plus a constant, ``S`` the root of ``G``). When the
gate and up are exact, ``C = G`` and this is the plain whitened SVD of ``W``. Only Grams are
accumulated; both targets are functions of the same input ``x``, so the fit does not try to undo
upstream drift it cannot see (which is what sank an earlier version that chased the dense model's
trajectory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from svdmlp.activations import activate
from svdmlp.compression.decompose import Decomposition, Factors, Whitening
from svdmlp.compression.gram import accumulate_gram, accumulate_product

Projection = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class DownGrams:
    """Float64 Grams of the down projection's inputs: ``H̃ᵀH̃``, ``H̃ᵀH`` and ``HᵀH``."""

    compressed: torch.Tensor | None
    cross: torch.Tensor
    dense: torch.Tensor


@dataclass(frozen=True)
class Healed:
    """The fitted factors and the relative output error before (whitened SVD on ``H``) and after."""

    factors: Factors
    before: float
    after: float


@torch.no_grad()
def down_grams(
    inputs: list[torch.Tensor],
    dense: tuple[Projection, Projection],
    compressed: tuple[Projection, Projection],
    activation: str,
    dense_gram: torch.Tensor,
) -> DownGrams:
    """Grams ``H̃ᵀH̃`` and ``H̃ᵀH`` of ``h`` (dense gate/up) and ``h̃`` (compressed) over ``inputs``.

    Args:
        inputs: the MLP's calibration inputs, batches of ``(..., hidden)``.
        dense, compressed: ``(gate, up)`` as functions of ``x (tokens, hidden)`` in float32.
        activation: the gate nonlinearity (see :func:`svdmlp.activations.activate`).
        dense_gram: ``HᵀH``, which calibration already accumulated as down's input Gram.
    """
    grams = DownGrams(*(torch.zeros_like(dense_gram) for _ in range(2)), dense=dense_gram)
    for batch in inputs:
        x = batch.detach().reshape(-1, batch.shape[-1]).float()
        h = activate(dense[0](x), activation) * dense[1](x)  # (tokens, inter)
        h_tilde = activate(compressed[0](x), activation) * compressed[1](x)
        accumulate_gram(grams.compressed, h_tilde)
        accumulate_product(grams.cross, h_tilde, h)
    if not inputs:
        raise ValueError("no calibration inputs reached this MLP")
    return grams


def output_error(weight: torch.Tensor, factors: Factors, grams: DownGrams, root: Whitening) -> float:
    """``‖W·Hᵀ − V·U·H̃ᵀ‖_F / ‖W·Hᵀ‖_F`` from the Grams, ``H̃ᵀH̃`` through its root ``L·Lᵀ = H̃ᵀH̃ + δ·I``.

    Expands the square: ``tr(W·HᵀH·Wᵀ) − 2·tr(W·HᵀH̃·Mᵀ) + tr(M·H̃ᵀH̃·Mᵀ)`` with ``M = V·U``, the last
    term as ``‖M·L‖² − δ·‖M‖²``.
    """
    w = weight.detach().to(torch.float64)  # (out, in)
    m = factors.v.to(torch.float64) @ factors.u.to(torch.float64)  # (out, in)
    target = ((w @ grams.dense) * w).sum()
    compressed = root.right(m).square().sum() - root.shift * m.square().sum()
    square = target - 2 * ((w @ grams.cross.T) * m).sum() + compressed
    return float((square.clamp(min=0) / target).sqrt())


def rotated_target(weight: torch.Tensor, grams: DownGrams, whitening: Whitening) -> torch.Tensor:
    """``M₀·L`` for ``M₀ = W·Cᵀ·G⁻¹``, ``G = L·Lᵀ`` (ridged): ``W·Cᵀ·L⁻ᵀ``, one triangular solve.

    The input :meth:`svdmlp.compression.decompose.Decomposition.of_rotated` wants, without ever forming ``G⁻¹``.
    """
    w = weight.detach().to(torch.float64)
    return torch.linalg.solve_triangular(whitening.lower.mT, w @ grams.cross.T, upper=True, left=False)


def compensating_down(
    weight: torch.Tensor,
    grams: DownGrams,
    rank: int,
    before: Factors,
    reload: Callable[[], torch.Tensor] | None = None,
) -> Healed:
    """The rank-``rank`` down factors that best reproduce ``W·h`` from ``h̃`` (module docstring).

    Args:
        weight: the dense down projection ``W (hidden, inter)``.
        grams: from :func:`down_grams`; with ``reload``, its ``compressed`` Gram becomes its own root
            (no second inter² buffer: 0.5 GB for Llama-3.2-1B, 1.6 GB for Llama-3.1-8B) and is None after.
        before: the factorisation without compensation (whitened SVD on ``h``), for the report and
            as the fallback should rounding make the fit worse.
        reload: makes ``H̃ᵀH̃`` again, should a larger ridge be needed (see
            :meth:`~svdmlp.compression.decompose.Whitening.from_gram`); without it the Gram is copied.
    """
    whitening = Whitening.from_gram(grams.compressed, reload=reload)
    if reload is not None:
        grams.compressed = None  # it is the root now
    fitted = Decomposition.of_rotated(rotated_target(weight, grams, whitening), whitening).factors(rank)
    error_before = output_error(weight, before, grams, whitening)
    error_after = output_error(weight, fitted, grams, whitening)
    if error_after > error_before:
        return Healed(before, error_before, error_before)
    return Healed(fitted, error_before, error_after)
