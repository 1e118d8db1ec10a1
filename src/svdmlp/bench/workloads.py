"""The MLPs being timed: random weights in each provider's layout, and the providers themselves.

Speed does not depend on the weights' values, so they are random, scaled so every activation is of
order one (outputs of order one make bf16 error checks meaningful). Providers:

- ``dense``: cuBLAS through ``F.linear``: gate and up as one GEMM on concatenated weights, SiLU·mul,
  down. The strongest plain-PyTorch dense baseline (one GEMM fewer than separate gate and up).
- ``unfused``: the PyTorch reference low-rank MLP (:func:`svdmlp.backends.torch_ref.lowrank_gated_mlp`:
  ``x·[U_gate | U_up]`` as one GEMM, two expands, SiLU·mul, down shrink and expand).
- ``fused``: the same op from the ``triton`` backend of the registry.
- ``fused_int8``, ``fused_int4`` (decode sizes): :func:`svdmlp.kernels.quantized_gated_mlp` on the
  factors stored quantized (:func:`quantized_lowrank`), as ``compress --factor-bits 8|4`` stores them.
- ``compiled``: ``torch.compile`` of the reference low-rank MLP (optional).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from svdmlp.factor_layout import GatedFactors
from svdmlp.int_weights import QuantizedMatrix, Scheme, stored_bytes

# Rotate among copies of the weights until they span three L2 caches, so that no call finds its
# weights still cached by the previous one: in a decoder, every other layer's weights pass through
# L2 between two calls of the same MLP. Eight copies at most bounds the memory spent on it.
ROTATION_CACHE_MULTIPLE = 3
MAX_WEIGHT_SETS = 8
# bf16 outputs of a chain of three matrix products, each rounding to 2^-8 relative: the fused and
# the PyTorch paths differ in accumulation order and in where they round, by about 1e-2 at worst.
BF16_REL_TOLERANCE = 2e-2
# float32 inputs: Triton's dot runs them as tf32 by default, about 3e-4 relative.
FP32_REL_TOLERANCE = 1e-3


@dataclass(frozen=True)
class DenseMLP:
    gate_up: torch.Tensor  # (2·inter, hidden): nn.Linear layout, gate rows first
    down: torch.Tensor  # (hidden, inter)

    @property
    def nbytes(self) -> int:
        return self.gate_up.nbytes + self.down.nbytes


@dataclass(frozen=True)
class LowRankMLP:
    """The factors, float tensors or all :class:`~svdmlp.int_weights.QuantizedMatrix` (same shapes)."""

    gate_up_u_t: torch.Tensor | QuantizedMatrix  # (hidden, r_gate + r_up)
    gate_v_t: torch.Tensor | QuantizedMatrix  # (r_gate, inter)
    up_v_t: torch.Tensor | QuantizedMatrix  # (r_up, inter)
    down_u_t: torch.Tensor | QuantizedMatrix  # (inter, r_down)
    down_v_t: torch.Tensor | QuantizedMatrix  # (r_down, hidden)

    @property
    def factors(self) -> GatedFactors:
        return GatedFactors(self.gate_up_u_t, self.gate_v_t, self.up_v_t, self.down_u_t, self.down_v_t)

    @property
    def nbytes(self) -> int:
        """Bytes as stored: quantized factors packed, with their scales."""
        return sum(stored_bytes(f) for f in self.factors)


def _randn(rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Entries of variance ``1/cols`` when used as ``x @ w`` contracting over ``rows``."""
    return torch.randn(rows, cols, device=device, dtype=dtype) / math.sqrt(rows)


def random_dense(hidden: int, inter: int, dtype: torch.dtype, device: torch.device) -> DenseMLP:
    return DenseMLP(
        gate_up=_randn(hidden, 2 * inter, dtype, device).T.contiguous(),
        down=_randn(inter, hidden, dtype, device).T.contiguous(),
    )


def random_lowrank(
    hidden: int, inter: int, ranks: tuple[int, int, int], dtype: torch.dtype, device: torch.device
) -> LowRankMLP:
    gate, up, down = ranks
    return LowRankMLP(
        gate_up_u_t=_randn(hidden, gate + up, dtype, device),
        gate_v_t=_randn(gate, inter, dtype, device),
        up_v_t=_randn(up, inter, dtype, device),
        down_u_t=_randn(inter, down, dtype, device),
        down_v_t=_randn(down, hidden, dtype, device),
    )


def quantized_lowrank(weights: LowRankMLP, how: Scheme) -> LowRankMLP:
    """``weights`` with every factor quantized by ``how``."""
    return LowRankMLP(*(QuantizedMatrix.of(factor, how) for factor in weights.factors))


def weight_sets(make: Callable[[], DenseMLP | LowRankMLP], cache_bytes: int) -> list:
    """Enough copies of the weights that, taken in turn, they overflow the cache (see above)."""
    first = make()
    count = min(MAX_WEIGHT_SETS, max(1, math.ceil(ROTATION_CACHE_MULTIPLE * cache_bytes / first.nbytes)))
    return [first] + [make() for _ in range(count - 1)]


def dense_mlp(x: torch.Tensor, w: DenseMLP) -> torch.Tensor:
    gate, up = F.linear(x, w.gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w.down)


def lowrank_provider(op: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor, LowRankMLP], torch.Tensor]:
    """Adapt a backend's ``lowrank_gated_mlp`` to ``(x, weights) -> y``."""

    def run(x: torch.Tensor, w: LowRankMLP) -> torch.Tensor:
        return op(x, *w.factors, "silu")

    return run


def rotating(provider: Callable, x: torch.Tensor, sets: list) -> Callable[[], None]:
    """One call over every weight set in turn: the timed unit (divide its time by ``len(sets)``)."""

    def run() -> None:
        for weights in sets:
            provider(x, weights)

    return run


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """How far ``out`` is from ``ref``: max error over max magnitude, and the normwise relative error."""
    tolerance = FP32_REL_TOLERANCE if ref.dtype == torch.float32 else BF16_REL_TOLERANCE
    out, ref = out.float(), ref.float()
    finite = bool(torch.isfinite(out).all())
    max_rel = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    rel = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
    return {"max_rel_err": max_rel, "rel_err": rel, "ok": finite and rel <= tolerance, "tolerance": tolerance}
