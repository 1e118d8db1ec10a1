"""Pure low-rank math: plain and activation-aware (whitened) SVD, and error metrics.

Nothing here knows about modules, hooks or files: tensors and ints in, tensors and floats out. Which
rank to cut at is :mod:`svdmlp.compression.ranks`'s business.

Conventions: a projection ``W (out, in)`` is approximated by ``V (out, r) @ U (r, in)``.

Two-sided (output-aware) weighting: with an output Gram ``G_out ≈ E[g·gᵀ]`` (``g`` the loss gradient
at the projection's output, :mod:`svdmlp.compression.output_grams`) besides the input Gram ``XᵀX``,
``Decomposition.of(W, input_whitening, output=output_whitening)`` minimises ``‖S_out·(W − VU)·S_in‖_F``,
the Kronecker-factored (K-FAC) second-order estimate of the loss increase, instead of the output error
``‖(W − VU)·Xᵀ‖_F`` that weighs every output direction alike.
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
        # eigh reads the lower triangle alone, so no symmetrised copy (n² float64: 0.5 GB at n = 8192):
        # the Grams are symmetric up to rounding (gram.symmetric_gram mirrors its off-diagonal blocks).
        g = gram.detach().to(torch.float64)
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

    def damped(self, damping: float) -> Whitening:
        """The whitening of :func:`damped_gram` ``(G, damping)`` from this one's eigenbasis, without a
        second eigendecomposition: ``G + δ·I`` has ``G``'s eigenvectors and eigenvalues ``λ + δ``.

        ``δ = damping·mean(λ)`` (the mean diagonal of ``G``), from the floored eigenvalues: it differs
        from damping the exact Gram only by the floor (at most ``floor·λ_max`` per eigenvalue).
        """
        if damping < 0:
            raise ValueError(f"damping must be >= 0, got {damping}")
        eigenvalues = self.root.square()
        return Whitening(self.basis, (eigenvalues + damping * eigenvalues.mean()).sqrt())


def damped_gram(gram: torch.Tensor, damping: float) -> torch.Tensor:
    """``G + damping·mean(diag G)·I`` in float64: a blend of ``G`` with the identity at ``G``'s own scale.

    The weighting it defines runs from ``G`` itself (``damping = 0``) to uniform (``damping → ∞``):
    for an output Gram, from pure loss-gradient weighting to plain input whitening. The output Gram of
    a few thousand calibration tokens is noisy, and its small eigenvalues are the least reliable;
    damping raises them all by the same amount.
    """
    if damping < 0:
        raise ValueError(f"damping must be >= 0, got {damping}")
    g = gram.detach().to(torch.float64)
    return g + damping * g.diagonal().mean() * torch.eye(g.shape[0], dtype=g.dtype, device=g.device)


def _rotated(
    weight: torch.Tensor, whitening: Whitening | None, output: Whitening | None = None
) -> torch.Tensor:
    """``W·Q·diag(r)`` in float64: ``W·S`` up to an orthogonal rotation (``W`` itself without whitening);
    with an output whitening ``(Q_o, r_o)`` also ``diag(r_o)·Q_oᵀ`` on the left."""
    w = weight.detach().to(torch.float64)
    if whitening is not None:
        w = (w @ whitening.basis) * whitening.root
    if output is not None:
        w = (output.basis.T @ w) * output.root[:, None]
    return w


@dataclass(frozen=True)
class Decomposition:
    """The SVD of ``W·S`` (of ``W`` itself without whitening; of ``S_out·W·S`` with an output
    whitening): factors at any rank and the energy spectrum, all from one SVD (rank allocation needs
    both for the same matrix)."""

    left: torch.Tensor  # (out, k), in the output whitening's basis when output-whitened
    sigma: torch.Tensor  # (k,), descending
    right_h: torch.Tensor  # (k, in), in the whitening's basis when whitened
    whitening: Whitening | None = None
    output: Whitening | None = None

    @classmethod
    def of(
        cls, weight: torch.Tensor, whitening: Whitening | None = None, output: Whitening | None = None
    ) -> Decomposition:
        """The SVD of ``W`` weighted by the input ``whitening`` on the right and, when given, by the
        ``output`` whitening (the root of the output-gradient Gram) on the left."""
        return cls.of_rotated(_rotated(weight, whitening, output), whitening, output)

    @classmethod
    def of_rotated(
        cls, rotated: torch.Tensor, whitening: Whitening | None, output: Whitening | None = None
    ) -> Decomposition:
        """From ``A = W·Q·diag(r)`` formed by the caller (who may reach ``A`` more cheaply than
        through ``W``, see :mod:`svdmlp.compression.heal.closed_form`); ``diag(r_o)·Q_oᵀ·W·Q·diag(r)``
        with an ``output`` whitening."""
        # Float64 throughout: dividing by small roots in factors() amplifies any SVD rounding (a
        # float32 SVD perturbed full-rank reconstructions by 1e-2 relative in low-activation directions).
        left, sigma, right_h = torch.linalg.svd(rotated, full_matrices=False)
        return cls(left, sigma, right_h, whitening, output)

    @property
    def energy(self) -> torch.Tensor:
        """Squared singular values, descending: the truncation error of rank r, activation-weighted
        when whitened (and loss-gradient-weighted when output-whitened), is the sum of the tail."""
        return self.sigma.square()

    def factors(self, rank: int) -> Factors:
        """The rank-``rank`` truncation with the singular values split as √Σ on each side (the
        paper's code), mapped back through ``S⁻¹ = Q·diag(1/r)·Qᵀ`` when whitened, and through
        ``S_out⁻¹`` on the left when output-whitened."""
        scale = self.sigma[:rank].sqrt()
        v = self.left[:, :rank] * scale  # (out, r)
        u = scale[:, None] * self.right_h[:rank]  # (r, in)
        if self.whitening is not None:
            u = (u / self.whitening.root) @ self.whitening.basis.T
        if self.output is not None:
            v = self.output.basis @ (v / self.output.root[:, None])
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


def two_sided_svd(weight: torch.Tensor, whitening: Whitening | None, output: Whitening, rank: int) -> Factors:
    """Output-aware SVD: the rank-``rank`` factors minimising ``‖S_out·(W − V·U)·S_in‖_F``.

    With ``S_in² = XᵀX`` (``whitening``) and ``S_out² = G_out ≈ E[g·gᵀ]`` (``output``, ``g`` the loss
    gradient at the projection's output), ``tr(G_out·E·XᵀX·Eᵀ)`` is the Kronecker-factored estimate of
    the loss increase that the weight error ``E`` causes, to second order. Both roots are symmetric
    and invertible (eigenvalues floored), so ``E' = S_out·E·S_in`` is a bijection of the error and the
    best rank-r approximation of ``S_out·W·S_in``, mapped back by ``S_out⁻¹`` and ``S_in⁻¹``, is optimal
    (Eckart-Young). ``G_out ∝ I`` gives :func:`whitened_svd` exactly.
    """
    return Decomposition.of(weight, whitening, output).factors(rank)


def weighted_relative_error(
    weight: torch.Tensor,
    factors: Factors,
    gram: torch.Tensor | None,
    output_gram: torch.Tensor | None = None,
) -> float:
    """Relative output error on the calibration activations, ``‖(W − VU)Xᵀ‖_F / ‖WXᵀ‖_F``.

    Computed from the Gram matrix as ``sqrt(tr(E·G·Eᵀ) / tr(W·G·Wᵀ))``; with ``gram=None`` it is the
    plain relative Frobenius error of the weight. With an ``output_gram`` ``G_o`` it is the two-sided
    error ``sqrt(tr(G_o·E·G·Eᵀ) / tr(G_o·W·G·Wᵀ))`` (:func:`two_sided_svd`'s objective).
    """
    w = weight.detach().to(torch.float64)
    err = w - factors.v.to(torch.float64) @ factors.u.to(torch.float64)
    if gram is None and output_gram is None:
        return float(err.norm() / w.norm())

    def weighted_square(m: torch.Tensor) -> torch.Tensor:
        right = m if gram is None else m @ gram.to(torch.float64)
        left = m if output_gram is None else output_gram.to(torch.float64) @ m
        return (left * right).sum()

    return float((weighted_square(err).clamp(min=0) / weighted_square(w)).sqrt())
