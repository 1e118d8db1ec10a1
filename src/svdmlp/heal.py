"""Closed-form healing: refit a factorisation's V so the compressed model reproduces the dense outputs.

A projection ``W (out, in)`` of the dense model sees inputs ``X (tokens, in)``; its factorisation
``V·U`` in the compressed model sees ``X̃`` instead (equal to ``X`` in one-shot mode, different once
earlier layers are compressed and calibration is sequential). Keeping ``U`` and choosing ``V`` to
minimise ``‖W·Xᵀ − V·U·X̃ᵀ‖_F`` is linear least squares with the closed form

    V = W·(XᵀX̃)·Uᵀ·(U·X̃ᵀX̃·Uᵀ)⁻¹,

which needs only Grams: ``X̃ᵀX̃``, the cross Gram ``X̃ᵀX`` and (for the error) ``XᵀX``. It is the
training-free part of SVD-LLM's update: no gradient steps, no activations kept. Being the optimum
over ``V`` for this ``U``, it never increases the calibration error (guarded against rounding below).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from svdmlp.calibrate import LayerGrams
from svdmlp.decompose import Factors

# Added to U·X̃ᵀX̃·Uᵀ as a fraction of its mean diagonal: U's rows can be nearly dependent on the
# calibration inputs (directions the eigenvalue floor of the whitening raised), and the solve must
# stay well posed there without moving V where the data decides it.
RIDGE = 1e-8


@dataclass(frozen=True)
class Targets:
    """Per MLP: the cross Grams ``X̃ᵀX`` and the dense Grams ``XᵀX`` of each projection's inputs."""

    cross: LayerGrams
    dense: LayerGrams

    @classmethod
    def one_shot(cls, grams: LayerGrams) -> Targets:
        """Targets when the compressed model sees the dense model's inputs (``X̃ = X``)."""
        return cls(cross=grams, dense=grams)


@dataclass(frozen=True)
class Healed:
    """The refitted factors and the relative output error against the dense model before and after."""

    factors: Factors
    before: float
    after: float


def output_error(
    weight: torch.Tensor, factors: Factors, gram: torch.Tensor, cross: torch.Tensor, dense: torch.Tensor
) -> float:
    """``‖W·Xᵀ − V·U·X̃ᵀ‖_F / ‖W·Xᵀ‖_F`` from ``gram = X̃ᵀX̃``, ``cross = X̃ᵀX``, ``dense = XᵀX``.

    Expands the square: ``tr(W·XᵀX·Wᵀ) − 2·tr(W·XᵀX̃·Mᵀ) + tr(M·X̃ᵀX̃·Mᵀ)`` with ``M = V·U``.
    """
    w = weight.detach().to(torch.float64)  # (out, in)
    m = factors.v.to(torch.float64) @ factors.u.to(torch.float64)  # (out, in)
    target = ((w @ dense) * w).sum()
    square = target - 2 * ((w @ cross.T) * m).sum() + ((m @ gram) * m).sum()
    return float((square.clamp(min=0) / target).sqrt())


def closed_form(
    weight: torch.Tensor,
    factors: Factors,
    gram: torch.Tensor,
    cross: torch.Tensor,
    dense: torch.Tensor,
    ridge: float = RIDGE,
) -> Healed:
    """The least-squares ``V`` for fixed ``U`` (see the module docstring), in float64.

    Args:
        weight: the dense ``W (out, in)``.
        factors: ``V (out, r)``, ``U (r, in)`` to heal; ``U`` is kept.
        gram, cross, dense: ``X̃ᵀX̃``, ``X̃ᵀX`` and ``XᵀX``, each ``(in, in)``.

    Returns:
        The healed factors (the given ones if rounding made the refit worse) and the errors.
    """
    n = weight.shape[1]
    for label, matrix in (("gram", gram), ("cross", cross), ("dense", dense)):
        if tuple(matrix.shape) != (n, n):
            raise ValueError(
                f"{label} Gram has shape {tuple(matrix.shape)}; the weight's inputs need ({n}, {n})"
            )
    gram, cross, dense = (m.to(torch.float64) for m in (gram, cross, dense))
    w = weight.detach().to(torch.float64)  # (out, in)
    u = factors.u.to(torch.float64)  # (r, in)
    normal = u @ gram @ u.T  # (r, r) = U·X̃ᵀX̃·Uᵀ
    normal = (normal + normal.T) / 2
    normal.diagonal().add_(ridge * normal.diagonal().mean())
    right = w @ cross.T @ u.T  # (out, r) = W·XᵀX̃·Uᵀ
    v = torch.linalg.solve(normal, right.T).T  # normal is symmetric: V·normal = right
    healed = Factors(u=factors.u, v=v.to(factors.v.dtype))
    before = output_error(weight, factors, gram, cross, dense)
    after = output_error(weight, healed, gram, cross, dense)
    if after > before:
        return Healed(factors, before, before)
    return Healed(healed, before, after)
