"""The low-rank gated MLP's decode schedule on factors stored quantized: three launches, as on float
factors, each reading its factors as stored; see :func:`quantized_gated_mlp`."""

from __future__ import annotations

import torch

from svdmlp.activations import check_activation
from svdmlp.factor_layout import GatedFactors
from svdmlp.kernels import common, configs
from svdmlp.kernels.common import check_device, check_inputs, device_guard, flatten_tokens
from svdmlp.kernels.dequantize import QuantizedFactor
from svdmlp.kernels.gated_mlp import check_gated_shapes
from svdmlp.kernels.quantized_gated_expand import _quantized_gated_expand_kernel, quantized_gated_expand
from svdmlp.kernels.quantized_matmul import quantized_matmul

OP = "quantized_gated_mlp"


def check_quantized_gated_mlp(x: torch.Tensor, factors: dict[str, QuantizedFactor], activation: str) -> None:
    """Raise ValueError, naming what is wrong, unless ``x`` and the quantized factors can run together."""
    check_activation(activation, OP)
    check_inputs(OP, x, {})
    schemes = {name: getattr(factor, "scheme", None) for name, factor in factors.items()}
    if len(set(schemes.values())) != 1 or None in schemes.values():
        raise ValueError(f"{OP}: every factor must be stored quantized, by one scheme; got {schemes}")
    for name, factor in factors.items():
        if factor.values.device != x.device:
            raise ValueError(f"{OP}: {name} is on {factor.values.device} but x is on {x.device}")
    shapes = {name: (factor.in_features, factor.out_features) for name, factor in factors.items()}
    check_gated_shapes(OP, x.shape[-1], shapes)


def quantized_gated_mlp(
    x: torch.Tensor,
    gate_up_u_t: QuantizedFactor,
    gate_v_t: QuantizedFactor,
    up_v_t: QuantizedFactor,
    down_u_t: QuantizedFactor,
    down_v_t: QuantizedFactor,
    activation: str,
) -> torch.Tensor:
    """:func:`svdmlp.backends.torch_ref.lowrank_gated_mlp` on factors quantized by one scheme
    (:class:`~svdmlp.kernels.dequantize.QuantizedFactor`: the float factors' names and ``(K, N)`` shapes), for
    at most :data:`~svdmlp.kernels.configs.DECODE_MAX_TOKENS` tokens; out in x's dtype.

    The float decode schedule (:func:`svdmlp.kernels.lowrank_gated_mlp`), each factor dequantized in
    the K loop that reads it, so a step streams about half (int8) or a quarter (int4) of the bf16
    factors' bytes:
    1. shrink ``t = x·gate_up_u_t`` (:func:`~svdmlp.kernels.quantized_matmul.quantized_matmul`), which
       also zeroes the fp32 down strip;
    2. gated expand, ``h`` kept on chip and shrunk at once by U_down into the down strip with fp32
       atomics (:func:`~svdmlp.kernels.quantized_gated_expand.quantized_gated_expand`);
    3. down expand ``y = t_d·down_v_t``, the strip rounded to x's dtype first.
    """
    factors = GatedFactors(gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t)._asdict()
    check_quantized_gated_mlp(x, factors, activation)
    check_device(OP, x, _quantized_gated_expand_kernel)
    x2d = flatten_tokens(x)
    m, hidden_size = x2d.shape
    if m > configs.DECODE_MAX_TOKENS:
        raise ValueError(
            f"{OP}: {m} tokens; the quantized schedule is for decode sizes (at most "
            f"{configs.DECODE_MAX_TOKENS}): above, multiply each dequantized factor (torch_ref)"
        )
    r_gate_up, inter, r_down = gate_up_u_t.out_features, gate_v_t.out_features, down_u_t.out_features
    out = common.new_empty((m, hidden_size), x.dtype, x.device)
    if min(m, hidden_size, r_gate_up, inter) == 0:
        return out.zero_().reshape(x.shape)  # an empty sum, as in the float op

    how = gate_up_u_t.scheme
    strip = common.new_empty((m, r_gate_up), x.dtype, x.device)
    down_strip = common.new_empty((m, r_down), torch.float32, x.device)
    with device_guard(x.device):
        quantized_matmul(
            x2d, gate_up_u_t.values, gate_up_u_t.scales, how.bits, how.group, strip, zero=down_strip
        )
        quantized_gated_expand(strip, gate_v_t, up_v_t, down_u_t, activation, down_strip)
        quantized_matmul(down_strip, down_v_t.values, down_v_t.scales, how.bits, how.group, out)
    return out.reshape(x.shape)
