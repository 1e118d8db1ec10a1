"""The whole low-rank gated MLP ``down(act(gate(x)) · up(x))`` in three (decode) or three-to-four
(above decode) launches; see :func:`lowrank_gated_mlp` for the schedules."""

from __future__ import annotations

import torch

from svdmlp.activations import check_activation
from svdmlp.factor_layout import FACTORS
from svdmlp.kernels import common, configs
from svdmlp.kernels.common import (
    check_device,
    check_inner,
    check_inputs,
    device_guard,
    flatten_tokens,
)
from svdmlp.kernels.gated_expand import _gated_expand_kernel, gated_expand
from svdmlp.kernels.lowrank_linear import lowrank_linear_into
from svdmlp.kernels.matmul import matmul, plain_gemm

SCHEDULES = ("decode", "prefill")


def check_gated_shapes(op: str, hidden: int, shapes: dict[str, tuple[int, int]]) -> None:
    """Raise ValueError, naming the offending dimensions, unless the factors' ``(K, N)`` shapes (by the
    names of :data:`svdmlp.factor_layout.FACTORS`) fit together and with ``x``'s ``hidden``."""
    gate_up, gate_v, up_v, down_u, down_v = (shapes[name] for name in FACTORS)
    check_inner(op, "x.shape[-1] (hidden)", hidden, "gate_up_u_t.shape[0]", gate_up[0])
    check_inner(
        op, "gate_up_u_t.shape[1]", gate_up[1], "r_gate + r_up (gate_v_t, up_v_t rows)", gate_v[0] + up_v[0]
    )
    check_inner(op, "gate_v_t.shape[1] (inter)", gate_v[1], "up_v_t.shape[1]", up_v[1])
    check_inner(op, "down_u_t.shape[0]", down_u[0], "inter (gate_v_t.shape[1])", gate_v[1])
    check_inner(op, "down_u_t.shape[1] (rank)", down_u[1], "down_v_t.shape[0]", down_v[0])
    check_inner(op, "down_v_t.shape[1]", down_v[1], "hidden (x.shape[-1])", hidden)


def check_gated_mlp(x: torch.Tensor, factors: tuple[torch.Tensor, ...], activation: str) -> None:
    """Raise ValueError, naming the offending shapes/dtypes/devices, unless the five ``factors`` (in the
    order of :class:`svdmlp.factor_layout.GatedFactors`) fit together and with ``x``."""
    op = "lowrank_gated_mlp"
    check_activation(activation, op)
    named = dict(zip(FACTORS, factors, strict=True))
    check_inputs(op, x, named)
    check_gated_shapes(op, x.shape[-1], {name: tuple(factor.shape) for name, factor in named.items()})


def lowrank_gated_mlp(
    x: torch.Tensor,
    gate_up_u_t: torch.Tensor,
    gate_v_t: torch.Tensor,
    up_v_t: torch.Tensor,
    down_u_t: torch.Tensor,
    down_v_t: torch.Tensor,
    activation: str,
    *,
    schedule: str | None = None,
) -> torch.Tensor:
    """Low-rank gated MLP, same contract as :func:`svdmlp.backends.torch_ref.lowrank_gated_mlp`.

    Shapes: x (..., hidden); gate_up_u_t (hidden, r_gate + r_up); gate_v_t (r_gate, inter);
    up_v_t (r_up, inter); down_u_t (inter, r_down); down_v_t (r_down, hidden) -> (..., hidden).
    ``activation`` is "silu" (SwiGLU) or "gelu_tanh" (GeGLU).

    Schedules (``schedule`` overrides the choice by token count; for tests and benchmarks):
    - decode (M ≤ 16), 3 launches, nothing of size ``inter`` ever reaches memory:
      1. shrink ``t = x·gate_up_u_t`` (gate and up share one read of x), split over the rank so the
         factor stream covers all SMs; the same launch zeroes the fp32 down strip;
      2. gated expand ``h = act(t_g·V_g)·(t_u·V_u)`` per column block of ``inter``, immediately
         shrunk by U_down and summed into the down strip with fp32 atomics (split-K over ``inter``);
      3. down expand ``y = t_d·V_down``.
      On sm_90 and newer, launches 2 and 3 are programmatic dependent launches: each starts while its
      predecessor drains and waits for its writes (:func:`svdmlp.kernels.configs.programmatic_launch`).
    - above decode, 3 or 4 launches: the shrink as a library GEMM (cuBLAS: nothing to fuse into it),
      the gated expand storing ``h`` (M × inter, x's dtype; the activation·mul stays its epilogue),
      then the down projection as :func:`lowrank_linear` (one fused launch when the down rank fits
      on chip and token blocks fill the GPU, else two library GEMMs). Atomics into an M × r_down
      buffer would cost M·r_down·inter/BLOCK_N operations: fine at M ≤ 16, not here.

    The Triton backend runs this or the unfused chain, whichever measures faster for the shape
    (:mod:`svdmlp.backends.choice`); the launch model predicts each launch (``svdmlp plan --launches``).
    """
    check_gated_mlp(x, (gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t), activation)
    check_device("lowrank_gated_mlp", x, _gated_expand_kernel)
    x2d = flatten_tokens(x)
    m, hidden_size = x2d.shape
    inter, r_down = down_u_t.shape
    out = common.new_empty((m, hidden_size), x.dtype, x.device)
    if schedule is None:
        schedule = "decode" if m <= configs.DECODE_MAX_TOKENS else "prefill"
    if schedule not in SCHEDULES:
        raise ValueError(f"lowrank_gated_mlp: unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    if min(m, hidden_size, gate_up_u_t.shape[1], inter) == 0:
        # Degenerate sizes (no tokens, no gate/up rank, no width): an empty sum, so zeros (or nothing).
        return out.zero_().reshape(x.shape)

    strip = common.new_empty((m, gate_up_u_t.shape[1]), x.dtype, x.device)
    with device_guard(x.device):
        if schedule == "decode":
            down_strip = common.new_empty((m, r_down), torch.float32, x.device)
            matmul(x2d, gate_up_u_t, strip, zero=down_strip)
            gated_expand(
                strip, gate_v_t, up_v_t, activation, down_u_t=down_u_t, down_strip=down_strip, dependent=True
            )
            matmul(down_strip, down_v_t, out, dependent=True)
        else:
            plain_gemm(x2d, gate_up_u_t, strip)
            hidden = common.new_empty((m, inter), x.dtype, x.device)
            gated_expand(strip, gate_v_t, up_v_t, activation, hidden=hidden)
            lowrank_linear_into(hidden, down_u_t, down_v_t, out)
    return out.reshape(x.shape)
