"""Pure low-rank math: plain and activation-aware (whitened) SVD, and error metrics.

Nothing here knows about modules, hooks or files: tensors and ints in, tensors and floats out. Which
rank to cut at is :mod:`svdmlp.ranks`'s business.

Conventions: a projection ``W (out, in)`` is approximated by ``V (out, r) @ U (r, in)``.

Two-sided (output-aware) weighting: with an output Gram ``G_out ≈ E[g·gᵀ]`` (``g`` the loss gradient
at the projection's output, :mod:`svdmlp.compression.output_grams`) besides the input Gram ``XᵀX``,
``Decomposition.of(W, input_whitening, output=output_whitening)`` minimises ``‖L_outᵀ·(W − VU)·L_in‖_F``
(``L`` the Grams' Cholesky roots),
the Kronecker-factored (K-FAC) second-order estimate of the loss increase, instead of the output error
``‖(W − VU)·Xᵀ‖_F`` that weighs every output direction alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from svdmlp import runtime

# The ridge ``δ = RIDGE · λ_max`` added to a Gram's diagonal before its Cholesky factorisation.
# Real models have near-singular input Grams (dead channels, outlier dimensions, fewer calibration
# tokens than an intermediate width): Cholesky of XᵀX itself fails on them (SVD-LLM issues 6, 7, 24).
# A ridge relative to the largest eigenvalue bounds the condition number by 1/RIDGE, so the float64
# factorisation always succeeds and the triangular solves stay accurate, while every direction that
# carries signal is left alone.
RIDGE = 1e-6
# ``W·L`` and ``Lᵀ·W`` with ``L`` lower triangular skip its zero blocks: strip ``j`` of ``L``'s columns
# is zero above its first row, so 4 strips do 10/16 of the full product's work (the float64 products
# through an 8960-wide root at Qwen2.5-1.5B's gate, up and down, twice per layer with allocation).
TRIANGLE_BLOCKS = 4


def strips(d: int, blocks: int) -> list[tuple[int, int]]:
    """``blocks`` near-equal ``(start, stop)`` ranges covering ``range(d)``: the strips of a triangle
    (here, and :mod:`svdmlp.compression.gram`'s Gram updates)."""
    edges = [d * i // blocks for i in range(blocks + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


@dataclass(frozen=True)
class Factors:
    """``W ≈ v @ u`` with ``u (r, in)`` and ``v (out, r)``, in float32 unless asked otherwise."""

    u: torch.Tensor
    v: torch.Tensor

    @property
    def rank(self) -> int:
        return self.u.shape[0]


def _top_eigenvalue(gram: torch.Tensor, iterations: int = 12) -> float:
    """``λ_max`` of a symmetric PSD matrix by power iteration from a fixed start (deterministic): an
    underestimate at worst, by a small factor, which is all a relative ridge needs (each iteration
    reads the whole matrix: 0.05 s at n = 8192)."""
    start = torch.randn(gram.shape[0], 1, generator=torch.Generator().manual_seed(0), dtype=gram.dtype)
    v = start.to(gram.device)
    for _ in range(iterations):
        v = gram @ v
        norm = v.norm()
        if norm == 0:
            return 0.0
        v = v / norm
    return float(v.mT @ gram @ v)


@dataclass(frozen=True)
class Whitening:
    """A triangular root ``L`` of a Gram matrix, ``L·Lᵀ = G + δ·I`` (Cholesky; ``δ``: :data:`RIDGE`).

    Every root ``R`` of ``G`` (``R·Rᵀ = G``) weighs an error alike, ``‖E·R‖_F² = tr(E·G·Eᵀ)``, and
    gives the same truncation: another root is ``R·Q`` with ``Q`` orthogonal, which leaves the singular
    values of ``W·R`` and the best rank-r approximation mapped back by ``R⁻¹`` unchanged. Cholesky's is
    the cheapest to make (n³/3 flops, in place, against about 9n³ and four n² buffers for an
    eigendecomposition: 5 s against 97 s at n = 8192 on two cores) and to undo (triangular solves).
    """

    lower: torch.Tensor  # L (n, n), float64, lower triangular
    shift: float = 0.0  # δ: what was added to the Gram's diagonal (damping and ridge)

    @classmethod
    def from_gram(
        cls,
        gram: torch.Tensor,
        ridge: float = RIDGE,
        damping: float = 0.0,
        reload: Callable[[], torch.Tensor] | None = None,
    ) -> Whitening:
        """The root of ``G + damping·mean(diag G)·I`` plus the ridge, made in one float64 copy of ``G``
        that becomes ``L`` (memory: the Gram and one n² buffer).

        The damping blends ``G`` with the identity at ``G``'s own scale: the weighting runs from ``G``
        itself (0) to uniform (∞); for an output Gram, from pure loss-gradient weighting to plain input
        whitening. The output Gram of a few thousand calibration tokens is noisy, and its small
        eigenvalues are the least reliable; damping raises them all by the same amount.

        Args:
            reload: gives the Gram again (from its file): ``gram`` is then the caller's to lose and
                becomes the root itself (no second n² buffer: 1.6 GB at n = 14336), and should
                rounding call for a larger ridge, the next attempt works on a fresh copy from it.
        """
        if damping < 0:
            raise ValueError(f"damping must be >= 0, got {damping}")
        if not runtime.all_finite(gram):
            raise ValueError(
                "calibration Gram matrix has NaN or inf entries: the model's activations overflowed"
            )
        source = gram.detach()
        top = _top_eigenvalue(source.to(torch.float64))
        if not top > 0:
            raise ValueError("calibration Gram matrix is zero: no activations reached this projection")
        shift = damping * float(source.diagonal().double().mean())
        for attempt in range(3):  # rounding can leave a Gram slightly indefinite: raise the ridge
            if reload is None:
                lower = source.to(torch.float64, copy=True)
            else:
                lower = (source if attempt == 0 else reload().detach()).to(torch.float64).contiguous()
            added = shift + ridge * 100**attempt * top
            lower.diagonal().add_(added)
            # The row-major matrix read column-major is itself (symmetric), and the upper factor Uᵀ = L
            # computed in that view, in place, is L in row-major: no second n² buffer.
            view, info = lower.mT, torch.empty((), dtype=torch.int32, device=lower.device)
            torch.linalg.cholesky_ex(view, upper=True, out=(view, info))
            if int(info) == 0:
                return cls(lower, added)
            if ridge == 0:
                break
        raise ValueError(
            "calibration Gram matrix is not positive semi-definite (Cholesky failed): it is corrupted"
        )

    def gram(self) -> torch.Tensor:
        """``L·Lᵀ``: the (ridged, damped) Gram this root stands for (tests and diagnostics)."""
        return self.lower @ self.lower.mT

    def right(self, w: torch.Tensor) -> torch.Tensor:
        """``W·L``: ``W`` weighted by its inputs' statistics."""
        out = w.new_empty(w.shape[0], self.lower.shape[1])
        for start, stop in strips(self.lower.shape[0], TRIANGLE_BLOCKS):  # column strips of L
            out[:, start:stop] = w[:, start:] @ self.lower[start:, start:stop]
        return out

    def right_inverse(self, b: torch.Tensor) -> torch.Tensor:
        """``B·L⁻¹`` by a triangular solve."""
        return torch.linalg.solve_triangular(self.lower, b, upper=False, left=False)

    def left(self, w: torch.Tensor) -> torch.Tensor:
        """``Lᵀ·W``: ``W`` weighted by its outputs' statistics (``‖Lᵀ·E‖_F² = tr(G·E·Eᵀ)``)."""
        out = w.new_empty(self.lower.shape[1], w.shape[1])
        for start, stop in strips(self.lower.shape[0], TRIANGLE_BLOCKS):  # row strips of Lᵀ
            out[start:stop] = self.lower[start:, start:stop].mT @ w[start:]
        return out

    def left_inverse(self, b: torch.Tensor) -> torch.Tensor:
        """``L⁻ᵀ·B`` by a triangular solve."""
        return torch.linalg.solve_triangular(self.lower.mT, b, upper=True, left=True)


def _rotated(
    weight: torch.Tensor, whitening: Whitening | None, output: Whitening | None = None
) -> torch.Tensor:
    """``W·L`` in float64 (``W`` itself without whitening); with an output whitening ``L_o`` also
    ``L_oᵀ`` on the left."""
    w = weight.detach().to(torch.float64)
    if whitening is not None:
        w = whitening.right(w)
    if output is not None:
        w = output.left(w)
    return w


@dataclass(frozen=True)
class Decomposition:
    """The SVD of ``W·L`` (of ``W`` itself without whitening; of ``L_oᵀ·W·L`` with an output
    whitening): factors at any rank and the energy spectrum, all from one SVD (rank allocation needs
    both for the same matrix)."""

    left: torch.Tensor  # (out, k), of L_oᵀ·W·L when output-whitened
    sigma: torch.Tensor  # (k,), descending
    right_h: torch.Tensor  # (k, in), of W·L when whitened
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
        """From ``A = W·L`` formed by the caller (who may reach ``A`` more cheaply than through ``W``,
        see :mod:`svdmlp.compression.heal.closed_form`); ``L_oᵀ·W·L`` with an ``output`` whitening."""
        # Float64 throughout: undoing small roots in factors() amplifies any SVD rounding (a float32
        # SVD perturbed full-rank reconstructions by 1e-2 relative in low-activation directions).
        if rotated.shape[0] < rotated.shape[1]:
            # A wide matrix (down's) is decomposed through its transpose, A = (Aᵀ)ᵀ = (V·Σ·Uᵀ)ᵀ: the
            # CPU LAPACK's SVD of the row-major wide matrix is 3x slower than of its tall
            # transposed view (576 x 1536: 0.5 s against 0.16 s on two cores; BENCHMARKS.md).
            right, sigma, left_h = torch.linalg.svd(rotated.mT, full_matrices=False)
            return cls(left_h.mT, sigma, right.mT, whitening, output)
        left, sigma, right_h = torch.linalg.svd(rotated, full_matrices=False)
        return cls(left, sigma, right_h, whitening, output)

    @property
    def energy(self) -> torch.Tensor:
        """Squared singular values, descending: the truncation error of rank r, activation-weighted
        when whitened (and loss-gradient-weighted when output-whitened), is the sum of the tail."""
        return self.sigma.square()

    def factors(self, rank: int) -> Factors:
        """The rank-``rank`` truncation with the singular values split as √Σ on each side (the
        paper's code), mapped back through ``L⁻¹`` on the right when whitened, and through ``L_o⁻ᵀ``
        on the left when output-whitened (triangular solves)."""
        scale = self.sigma[:rank].sqrt()
        v = self.left[:, :rank] * scale  # (out, r)
        u = scale[:, None] * self.right_h[:rank]  # (r, in)
        if self.whitening is not None:
            u = self.whitening.right_inverse(u)
        if self.output is not None:
            v = self.output.left_inverse(v)
        return Factors(u=u.float(), v=v.float())


def plain_svd(weight: torch.Tensor, rank: int) -> Factors:
    """Truncated SVD of W (float64), the rank-``rank`` factors minimising ``‖W − V·U‖_F``."""
    return Decomposition.of(weight).factors(rank)


def whitened_svd(weight: torch.Tensor, whitening: Whitening, rank: int) -> Factors:
    """Activation-aware SVD: the rank-``rank`` factors minimising ``‖(W − V·U)·Xᵀ‖_F``.

    ``‖(W − W')·Xᵀ‖_F = ‖(W − W')·L‖_F`` with ``L·Lᵀ = XᵀX`` (:class:`Whitening`), so the best
    rank-r approximation of ``W·L``, mapped back by ``L⁻¹`` (a triangular solve, never an inverse),
    minimises the output error on the calibration activations.
    """
    return Decomposition.of(weight, whitening).factors(rank)


def two_sided_svd(weight: torch.Tensor, whitening: Whitening | None, output: Whitening, rank: int) -> Factors:
    """Output-aware SVD: the rank-``rank`` factors minimising ``‖L_oᵀ·(W − V·U)·L‖_F``.

    With ``L·Lᵀ = XᵀX`` (``whitening``) and ``L_o·L_oᵀ = G_out ≈ E[g·gᵀ]`` (``output``, ``g`` the loss
    gradient at the projection's output), ``‖L_oᵀ·E·L‖_F² = tr(G_out·E·XᵀX·Eᵀ)`` is the
    Kronecker-factored estimate of the loss increase that the weight error ``E`` causes, to second
    order. Both roots are invertible (ridged), so ``E' = L_oᵀ·E·L`` is a bijection of the error and the
    best rank-r approximation of ``L_oᵀ·W·L``, mapped back by ``L_o⁻ᵀ`` and ``L⁻¹``, is optimal
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
