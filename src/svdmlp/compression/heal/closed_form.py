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

``C`` itself is never formed: the fit needs only ``W·Cᵀ = (H·Wᵀ)ᵀ·H̃``, the dense MLP's outputs
against ``h̃``, accumulated at ``hidden × inter`` for ``2·hidden·inter`` per token where ``C`` cost
``2·inter²`` (Qwen2.5-Coder-1.5B: 2.9x fewer products, and no third inter² matrix in memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from svdmlp.activations import activate
from svdmlp.compression.gram import accumulate_gram, accumulate_product
from svdmlp.decompose import Decomposition, Factors, Whitening

Projection = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class DownGrams:
    """Float64 statistics of the down projection's inputs: the Grams ``H̃ᵀH̃`` and ``HᵀH``, and
    ``W·Cᵀ = W·HᵀH̃`` (``hidden × inter``), what the fit needs of the cross Gram ``C = H̃ᵀH``."""

    compressed: torch.Tensor | None
    weight_cross: torch.Tensor
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
    weight: torch.Tensor,
) -> DownGrams:
    """``H̃ᵀH̃`` and ``W·HᵀH̃`` of ``h`` (dense gate/up) and ``h̃`` (compressed) over ``inputs``.

    Args:
        inputs: the MLP's calibration inputs, batches of ``(..., hidden)``.
        dense, compressed: ``(gate, up)`` as functions of ``x (tokens, hidden)`` in float32.
        activation: the gate nonlinearity (see :func:`svdmlp.activations.activate`).
        dense_gram: ``HᵀH``, which calibration already accumulated as down's input Gram.
        weight: the dense down projection ``W (hidden, inter)``.
    """
    w_t = weight.detach().float().T
    grams = DownGrams(
        torch.zeros_like(dense_gram),
        torch.zeros(weight.shape, dtype=torch.float64, device=dense_gram.device),
        dense=dense_gram,
    )
    for batch in inputs:
        x = batch.detach().reshape(-1, batch.shape[-1]).float()
        h = activate(dense[0](x), activation) * dense[1](x)  # (tokens, inter)
        h_tilde = activate(compressed[0](x), activation) * compressed[1](x)
        accumulate_gram(grams.compressed, h_tilde)
        accumulate_product(grams.weight_cross, h @ w_t, h_tilde)  # Σ (W·h)·h̃ᵀ
    if not inputs:
        raise ValueError("no calibration inputs reached this MLP")
    return grams


class OutputError:
    """``‖W·Hᵀ − V·U·H̃ᵀ‖_F / ‖W·Hᵀ‖_F`` of any factors of down, from the Grams.

    Expands the square: ``tr(W·HᵀH·Wᵀ) − 2·tr(W·HᵀH̃·Mᵀ) + tr(M·H̃ᵀH̃·Mᵀ)`` with ``M = V·U``. The first
    term and ``W·HᵀH̃`` (which the fit needs too) are made once; the others go through the factors,
    never ``M`` itself: ``tr(M·H̃ᵀH̃·Mᵀ) = ‖V·U·L‖² − δ·‖V·U‖²`` (``L·Lᵀ = H̃ᵀH̃ + δ·I``) from ``U·L``
    and ``VᵀV``. At Qwen2.5-1.5B's down (1536 × 8960, rank about 1050) an error costs a third of the
    float64 products of forming ``M`` and multiplying it through the inter² Grams.
    """

    def __init__(
        self, weight: torch.Tensor, dense_gram: torch.Tensor, weight_cross: torch.Tensor, root: Whitening
    ):
        """``weight_cross``: ``W·HᵀH̃`` (``W·Cᵀ``); ``root``: of ``H̃ᵀH̃``."""
        w = weight.detach().to(torch.float64)
        self.target = ((w @ dense_gram) * w).sum()
        self.weight_cross, self.root = weight_cross, root

    def __call__(self, factors: Factors) -> float:
        v, u = factors.v.to(torch.float64), factors.u.to(torch.float64)
        cross = ((self.weight_cross @ u.mT) * v).sum()  # tr(W·Cᵀ·Uᵀ·Vᵀ)
        v_gram, u_root = v.mT @ v, self.root.right(u)  # VᵀV (r, r), U·L (r, in)
        compressed = ((v_gram @ u_root) * u_root).sum() - self.root.shift * (v_gram * (u @ u.mT)).sum()
        square = self.target - 2 * cross + compressed
        return float((square.clamp(min=0) / self.target).sqrt())


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
            (no second inter² buffer: 0.5 GB for Llama-3.2-1B, 1.6 GB for Llama-3.1-8B) and is None
            after.
        before: the factorisation without compensation (whitened SVD on ``h``), for the report and
            as the fallback should rounding make the fit worse.
        reload: makes ``H̃ᵀH̃`` again, should a larger ridge be needed (see
            :meth:`~svdmlp.decompose.Whitening.from_gram`); without it the Gram is copied.
    """
    weight_cross = grams.weight_cross  # W·Cᵀ: all the fit needs of C
    whitening = Whitening.from_gram(grams.compressed, reload=reload)
    if reload is not None:
        grams.compressed = None  # it is the root now
    # M₀·L = W·Cᵀ·G⁻¹·L = W·Cᵀ·L⁻ᵀ (G = L·Lᵀ, ridged): one triangular solve, G⁻¹ never formed.
    rotated = torch.linalg.solve_triangular(whitening.lower.mT, weight_cross, upper=True, left=False)
    fitted = Decomposition.of_rotated(rotated, whitening).factors(rank)
    del rotated
    error = OutputError(weight, grams.dense, weight_cross, whitening)
    error_before, error_after = error(before), error(fitted)
    if error_after > error_before:
        return Healed(before, error_before, error_before)
    return Healed(fitted, error_before, error_after)
