"""A quantized weight with its error's dominant directions kept: ``W ≈ Q(W) + V·U``.

Low-rank correction of quantization (LQER, QERA, EoRA): the weight is rounded to a few bits, and the
rounding error's best rank-``r`` approximation is kept beside it in bf16. Both parts minimise the same
error, the output error on the calibration activations ``‖(W − Q − V·U)·Xᵀ‖_F``: GPTQ rounds against the
input Gram ``XᵀX``, and the correction is the whitened SVD of what it left (:mod:`svdmlp.decompose`).

The two are then solved in turn (``rounds``): ``W − V·U`` rounded again by GPTQ, which now sees the
directions the correction carries and spends its grid on the rest, and the correction refitted to the
new error. Each step can only lower the error the other left, but GPTQ's greedy rounding is not an exact
minimiser, so each round is measured, not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from svdmlp import decompose
from svdmlp.int_weights import Scheme, dequantize, gptq

# Quantization and correction solved in turn this many times after the first pass. On SmolLM2-135M's
# real weights (int4-asym, rank 16: BENCHMARKS.md, session 29) the output error the correction leaves
# falls by 1.1% with one round and 1.9% with two; each round is one more GPTQ and SVD per weight.
CORRECTION_ROUNDS = 1


@dataclass(frozen=True)
class Corrected:
    """``(q, scales, zeros)`` in :func:`svdmlp.int_weights.gptq`'s form (with its zero points) and the
    correction ``v @ u`` (None: not corrected)."""

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    correction: decompose.Factors | None


@torch.no_grad()
def corrected(
    weight: torch.Tensor,
    gram: torch.Tensor,
    whitening: decompose.Whitening,
    how: Scheme,
    rank: int,
    rounds: int,
) -> Corrected:
    """``weight (N, K)`` rounded by GPTQ on ``gram`` (its input's Gram, ``whitening`` its root) with a
    rank-``rank`` correction of the error, re-rounded and refitted ``rounds`` times."""
    weight = weight.float()

    def fit(q: torch.Tensor, scales: torch.Tensor) -> decompose.Factors:
        error = weight - dequantize(q, scales, tuple(weight.shape))
        return decompose.Decomposition.of(error, whitening).factors(rank)

    q, scales, zeros = gptq(weight, gram, how, return_zeros=True)
    factors = fit(q, scales)
    for _ in range(rounds):
        q, scales, zeros = gptq(weight - factors.v @ factors.u, gram, how, return_zeros=True)
        factors = fit(q, scales)
    return Corrected(q, scales, zeros, factors)
