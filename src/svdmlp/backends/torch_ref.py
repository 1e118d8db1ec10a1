"""PyTorch reference ops: the CPU path and the oracle every kernel is tested against.

Factor layout (decided once at compression/load time, so no transpose happens at run time):
a dense projection ``W (out, in)`` is approximated by ``V (out, r) · U (r, in)``. Modules store
``u_t = Uᵀ`` with shape ``(in, r)`` and ``v_t = Vᵀ`` with shape ``(r, out)``, both row-major, so
``y = (x @ u_t) @ v_t``: every product is a plain ``(M, K) @ (K, N)`` GEMM whose weight operand is
read along its contiguous dimension. A factor may also be stored quantized
(:class:`svdmlp.int_weights.QuantizedMatrix`), transposed as the integer kernels read it.

For a gated MLP, gate and up share one read of ``x``: their shrink factors are concatenated into
``gate_up_u_t (hidden, r_gate + r_up)`` and the first ``r_gate`` columns belong to gate.
"""

from __future__ import annotations

import torch

from svdmlp.activations import activate
from svdmlp.int_weights import is_quantized


def _times(x: torch.Tensor, factor) -> torch.Tensor:
    """``x @ factor`` for a float factor or a quantized one (:class:`svdmlp.int_weights.QuantizedMatrix`,
    which multiplies by its own kernel)."""
    return factor.matmul(x) if is_quantized(factor) else x @ factor


def lowrank_linear(x: torch.Tensor, u_t, v_t) -> torch.Tensor:
    """``y = (x @ u_t) @ v_t``. x: (..., in), u_t: (in, r), v_t: (r, out) -> (..., out)."""
    return _times(_times(x, u_t), v_t)


def _rows(factor) -> int:
    return factor.in_features if is_quantized(factor) else factor.shape[0]


def lowrank_gated_mlp(
    x: torch.Tensor, gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t, activation: str
) -> torch.Tensor:
    """Low-rank gated MLP: ``down(act(gate(x)) * up(x))`` with every projection factorised.

    Shapes: x (..., hidden); gate_up_u_t (hidden, r_gate + r_up); gate_v_t (r_gate, inter);
    up_v_t (r_up, inter); down_u_t (inter, r_down); down_v_t (r_down, hidden) -> (..., hidden).
    """
    gate, up = gate_and_up(x, gate_up_u_t, gate_v_t, up_v_t)
    hidden = activate(gate, activation) * up  # (..., inter)
    return lowrank_linear(hidden, down_u_t, down_v_t)


def gate_and_up(x: torch.Tensor, gate_up_u_t, gate_v_t, up_v_t) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate and up projections of ``x``, each ``(..., inter)``, from one read of ``x``."""
    r_gate = _rows(gate_v_t)
    strip = _times(x, gate_up_u_t)  # (..., r_gate + r_up)
    return _times(strip[..., :r_gate], gate_v_t), _times(strip[..., r_gate:], up_v_t)
