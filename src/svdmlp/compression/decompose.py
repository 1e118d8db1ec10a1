"""Pure low-rank math: plain and activation-aware (whitened) SVD, and error metrics.

Nothing here knows about modules, hooks or files: tensors and ints in, tensors and floats out. Which
rank to cut at is :mod:`svdmlp.compression.ranks`'s business.

Conventions: a projection ``W (out, in)`` is approximated by ``V (out, r) @ U (r, in)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Eigenvalues of the Gram matrix below ``EIG_FLOOR · λ_max`` are raised to that floor before
# whitening. Real models have near-singular input Grams (dead channels, outlier dimensions):
# Cholesky of XᵀX fails on them (SVD-LLM issues 6, 7, 24); a relative floor in float64 keeps the
# whitening well conditioned while leaving every direction that carries signal untouched.
EIG_FLOOR = 1e-6


@dataclass(frozen=True)
class Factors:
    """``W ≈ v @ u`` with ``u (r, in)`` and ``v (out, r)``, in float32 unless asked otherwise."""

    u: torch.Tensor
    v: torch.Tensor

    @property
    def rank(self) -> int:
        return self.u.shape[0]


@dataclass(frozen=True)
class Whitening:
    """The symmetric square root ``S = Q·diag(r)·Qᵀ`` of a Gram matrix ``XᵀX``, kept factored.

    ``r = √λ`` with the eigenvalues ``λ`` floored at ``floor·λ_max``. Kept as ``(Q, r)``: the
    factorisation works in ``Q``'s basis and never forms ``S`` or ``S⁻¹``, and one eigendecomposition
    serves every projection that reads the same input (gate and up).
    """

    basis: torch.Tensor  # Q (in, in), float64
    root: torch.Tensor  # r (in,), float64

    @classmethod
    def from_gram(cls, gram: torch.Tensor, floor: float = EIG_FLOOR) -> Whitening:
        g = gram.detach().to(torch.float64)
        g = (g + g.T) / 2
        if not torch.isfinite(g).all():
            raise ValueError(
                "calibration Gram matrix has NaN or inf entries: the model's activations overflowed"
            )
        eigenvalues, basis = torch.linalg.eigh(g)
        top = eigenvalues.max()
        if top <= 0:
            raise ValueError("calibration Gram matrix is zero: no activations reached this projection")
        return cls(basis=basis, root=eigenvalues.clamp(min=floor * top).sqrt())

    def matrix(self) -> torch.Tensor:
        """``S`` itself (for tests and diagnostics; the factorisation never forms it)."""
        return (self.basis * self.root) @ self.basis.T


def _rotated(weight: torch.Tensor, whitening: Whitening | None) -> torch.Tensor:
    """``W·Q·diag(r)`` in float64: ``W·S`` up to an orthogonal rotation (``W`` itself without whitening)."""
    w = weight.detach().to(torch.float64)
    return w if whitening is None else (w @ whitening.basis) * whitening.root


@dataclass(frozen=True)
class Decomposition:
    """The SVD of ``W·S`` (of ``W`` itself without whitening): factors at any rank and the energy
    spectrum, all from one SVD (rank allocation needs both for the same matrix)."""

    left: torch.Tensor  # (out, k)
    sigma: torch.Tensor  # (k,), descending
    right_h: torch.Tensor  # (k, in), in the whitening's basis when whitened
    whitening: Whitening | None = None

    @classmethod
    def of(cls, weight: torch.Tensor, whitening: Whitening | None = None) -> Decomposition:
        return cls.of_rotated(_rotated(weight, whitening), whitening)

    @classmethod
    def of_rotated(cls, rotated: torch.Tensor, whitening: Whitening | None) -> Decomposition:
        """From ``A = W·Q·diag(r)`` formed by the caller (who may reach ``A`` more cheaply than
        through ``W``, see :mod:`svdmlp.compression.heal.closed_form`)."""
        # Float64 throughout: dividing by small roots in factors() amplifies any SVD rounding (a
        # float32 SVD perturbed full-rank reconstructions by 1e-2 relative in low-activation directions).
        left, sigma, right_h = torch.linalg.svd(rotated, full_matrices=False)
        return cls(left, sigma, right_h, whitening)

    @property
    def energy(self) -> torch.Tensor:
        """Squared singular values, descending: the truncation error of rank r, activation-weighted
        when whitened, is the sum of the tail."""
        return self.sigma.square()

    def factors(self, rank: int) -> Factors:
        """The rank-``rank`` truncation with the singular values split as √Σ on each side (the
        paper's code), mapped back through ``S⁻¹ = Q·diag(1/r)·Qᵀ`` when whitened."""
        scale = self.sigma[:rank].sqrt()
        v = self.left[:, :rank] * scale  # (out, r)
        u = scale[:, None] * self.right_h[:rank]  # (r, in)
        if self.whitening is not None:
            u = (u / self.whitening.root) @ self.whitening.basis.T
        return Factors(u=u.float(), v=v.float())


def plain_svd(weight: torch.Tensor, rank: int) -> Factors:
    """Truncated SVD of W (float64), the rank-``rank`` factors minimising ``‖W − V·U‖_F``."""
    return Decomposition.of(weight).factors(rank)


def whitened_svd(weight: torch.Tensor, whitening: Whitening, rank: int) -> Factors:
    """Activation-aware SVD: the rank-``rank`` factors minimising ``‖(W − V·U)·Xᵀ‖_F``.

    ``‖(W − W')·Xᵀ‖_F = ‖(W − W')·S‖_F`` with ``S = Q·diag(r)·Qᵀ`` the root of ``XᵀX``, so the best
    rank-r approximation of ``W·S``, mapped back by ``S⁻¹``, minimises the output error on the
    calibration activations. ``Qᵀ`` is orthogonal, so the SVD of ``A = W·Q·diag(r)`` gives that of
    ``W·S = A·Qᵀ`` (right singular vectors rotated by ``Qᵀ``), and ``S⁻¹ = Q·diag(1/r)·Qᵀ`` folds
    into one thin product: two (in × in) GEMMs fewer than forming ``W·S`` and ``S⁻¹``.
    """
    return Decomposition.of(weight, whitening).factors(rank)


def weighted_relative_error(weight: torch.Tensor, factors: Factors, gram: torch.Tensor | None) -> float:
    """Relative output error on the calibration activations, ``‖(W − VU)Xᵀ‖_F / ‖WXᵀ‖_F``.

    Computed from the Gram matrix as ``sqrt(tr(E·G·Eᵀ) / tr(W·G·Wᵀ))``; with ``gram=None`` it is the
    plain relative Frobenius error of the weight.
    """
    w = weight.detach().to(torch.float64)
    err = w - factors.v.to(torch.float64) @ factors.u.to(torch.float64)
    if gram is None:
        return float(err.norm() / w.norm())
    g = gram.to(torch.float64)
    num = ((err @ g) * err).sum()
    den = ((w @ g) * w).sum()
    return float((num.clamp(min=0) / den).sqrt())
