"""A dense projection stored quantized, with an optional low-rank correction: ``y = x·Q(W)ᵀ + (x·U)·V``.

Weight-only int8/int4 is what users deploy when they do not compress, so svdmlp runs it in the same
engine as its own models to compare speed honestly; the correction (issue 50,
:mod:`svdmlp.compression.correction`) keeps the rounding error's dominant directions beside it. The
quantized weight multiplies by :class:`~svdmlp.int_weights.QuantizedMatrix`'s kernels (torch's
weight-only ones on CPU in bf16; svdmlp's Triton kernel at decode on CUDA, which adds the correction in
the same pass), the correction otherwise by two small products of factors in the low-rank modules'
layout, ``u_t (in, r)`` and ``v_t (r, out)``, floating point or themselves stored int8/int4 as ``svdmlp
compress --factor-bits`` stores an SVD model's factors.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from svdmlp import arch
from svdmlp.backends.torch_ref import lowrank_linear
from svdmlp.decompose import Factors
from svdmlp.int_weights import QuantizedMatrix, Scheme, stored_bytes


class QuantizedLinear(nn.Module):
    """A bias-free ``nn.Linear(in, out)`` whose weight is ``quantized`` (a :class:`QuantizedMatrix`),
    plus a rank-``rank`` correction ``(x @ u_t) @ v_t`` when ``rank`` > 0, its factors in ``dtype`` or,
    given ``factors_how``, each a :class:`QuantizedMatrix` of that scheme."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        how: Scheme,
        rank: int = 0,
        dtype=torch.bfloat16,
        device=None,
        factors_how: Scheme | None = None,
    ):
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.quantized = QuantizedMatrix(in_features, out_features, how, device=device)
        if rank and factors_how is not None:
            self.u_t = QuantizedMatrix(in_features, rank, factors_how, device=device)
            self.v_t = QuantizedMatrix(rank, out_features, factors_how, device=device)
        elif rank:
            self.u_t = nn.Parameter(
                torch.empty(in_features, rank, dtype=dtype, device=device), requires_grad=False
            )
            self.v_t = nn.Parameter(
                torch.empty(rank, out_features, dtype=dtype, device=device), requires_grad=False
            )

    @classmethod
    @torch.no_grad()
    def of(
        cls,
        linear: nn.Linear,
        how: Scheme,
        hessian: torch.Tensor | None = None,
        correction: Factors | None = None,
        dtype: torch.dtype | None = None,
        factors_how: Scheme | None = None,
    ) -> QuantizedLinear:
        """``linear``'s weight quantized by ``how`` (rounded to nearest, or by GPTQ given the Gram
        ``hessian`` of its inputs), with ``correction`` (``v (out, r)``, ``u (r, in)``) if given, its
        factors in ``dtype`` (default: the weight's) or rounded to nearest by ``factors_how``."""
        matrix = QuantizedMatrix.of(linear.weight.detach().T, how, hessian)
        return cls._around(linear, matrix, correction, dtype, factors_how)

    @classmethod
    @torch.no_grad()
    def rounded(
        cls,
        linear: nn.Linear,
        how: Scheme,
        rounding: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        correction: Factors | None = None,
        dtype: torch.dtype | None = None,
        factors_how: Scheme | None = None,
    ) -> QuantizedLinear:
        """``linear`` stored as the ``rounding`` ``(q, scales, zeros)`` already made by ``how``
        (:func:`svdmlp.int_weights.gptq`'s form with its zero points), with ``correction`` as in :meth:`of`."""
        q, scales, zeros = rounding
        matrix = QuantizedMatrix.rounded(q, scales, zeros, how, linear.in_features)
        return cls._around(linear, matrix, correction, dtype, factors_how)

    @classmethod
    def _around(
        cls,
        linear: nn.Linear,
        quantized: QuantizedMatrix,
        correction: Factors | None,
        dtype: torch.dtype | None,
        factors_how: Scheme | None,
    ) -> QuantizedLinear:
        if linear.bias is not None:
            raise ValueError("a quantized projection stands in for a bias-free linear layer only")
        dtype = dtype or linear.weight.dtype
        rank = 0 if correction is None else correction.rank
        module = cls(
            linear.in_features, linear.out_features, quantized.scheme, rank, dtype, "meta", factors_how
        )
        module.quantized = quantized
        if rank and factors_how is not None:  # each factor quantized along what it sums over
            module.u_t = QuantizedMatrix.of(correction.u.T.float(), factors_how)
            module.v_t = QuantizedMatrix.of(correction.v.T.float(), factors_how)
        elif rank:
            module.u_t = nn.Parameter(correction.u.T.to(dtype).contiguous(), requires_grad=False)
            module.v_t = nn.Parameter(correction.v.T.to(dtype).contiguous(), requires_grad=False)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank and self.quantized.fuses_correction(x, self.u_t, self.v_t):
            return self.quantized.matmul(x, correction=(self.u_t, self.v_t))  # one pass over x
        y = self.quantized.matmul(x)
        if self.rank:
            y = y + lowrank_linear(x, self.u_t, self.v_t)
        return y

    def nbytes(self) -> int:
        """Bytes as stored: the packed weight with its scales, and the correction's factors."""
        correction = [self.u_t, self.v_t] if self.rank else []
        return self.quantized.nbytes() + sum(stored_bytes(factor) for factor in correction)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}"


def install_empty(
    mlp: nn.Module,
    layout: arch.ArchSpec,
    how: Scheme,
    ranks: dict[str, int],
    dtype: torch.dtype,
    factors_how: Scheme | None,
) -> None:
    """Swap every projection of ``mlp`` for an empty :class:`QuantizedLinear` on the meta device, with a
    correction of ``ranks[name]`` where given: the skeleton that a checkpoint's weights, or a stopped
    run's file of the layer, fill."""
    for name in arch.PROJECTIONS:
        dense = getattr(mlp, layout.projection(name))
        empty = QuantizedLinear(
            dense.in_features, dense.out_features, how, ranks.get(name, 0), dtype, "meta", factors_how
        )
        setattr(mlp, layout.projection(name), empty)
