"""PyTorch reference ops: the CPU path and the oracle every kernel is tested against.

Factor layout (decided once at compression/load time, so no transpose happens at run time):
a dense projection ``W (out, in)`` is approximated by ``V (out, r) · U (r, in)``. Modules store
``u_t = Uᵀ`` with shape ``(in, r)`` and ``v_t = Vᵀ`` with shape ``(r, out)``, both row-major, so
``y = (x @ u_t) @ v_t``: every product is a plain ``(M, K) @ (K, N)`` GEMM whose weight operand is
read along its contiguous dimension.

For a gated MLP, gate and up share one read of ``x``: their shrink factors are concatenated into
``gate_up_u_t (hidden, r_gate + r_up)`` and the first ``r_gate`` columns belong to gate.
"""

from __future__ import annotations

import torch

from svdmlp.activations import activate


def lowrank_linear(x: torch.Tensor, u_t: torch.Tensor, v_t: torch.Tensor) -> torch.Tensor:
    """``y = (x @ u_t) @ v_t``. x: (..., in), u_t: (in, r), v_t: (r, out) -> (..., out)."""
    return (x @ u_t) @ v_t


def lowrank_gated_mlp(
    x: torch.Tensor,
    gate_up_u_t: torch.Tensor,
    gate_v_t: torch.Tensor,
    up_v_t: torch.Tensor,
    down_u_t: torch.Tensor,
    down_v_t: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    """Low-rank gated MLP: ``down(act(gate(x)) * up(x))`` with every projection factorised.

    Shapes: x (..., hidden); gate_up_u_t (hidden, r_gate + r_up); gate_v_t (r_gate, inter);
    up_v_t (r_up, inter); down_u_t (inter, r_down); down_v_t (r_down, hidden) -> (..., hidden).
    """
    r_gate = gate_v_t.shape[0]
    strip = x @ gate_up_u_t  # (..., r_gate + r_up): one read of x for both projections
    gate = strip[..., :r_gate] @ gate_v_t  # (..., inter)
    up = strip[..., r_gate:] @ up_v_t  # (..., inter)
    hidden = activate(gate, activation) * up  # (..., inter)
    return lowrank_linear(hidden, down_u_t, down_v_t)
