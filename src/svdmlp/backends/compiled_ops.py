"""The Triton backend's two ops as torch custom ops, so that ``torch.compile`` sees one opaque call.

Dynamo cannot trace into the launchers (their interpreter checks, Triton's launch options) nor into
the measured fused-or-unfused choice of :mod:`svdmlp.backends.choice`; traced, the engine's compiled
decode step failed and fell back to eager decoding (the device run of session 16: 41 ms/token). As
custom ops they stay one node in the compiled graph, their fake (meta) versions give the output's
shape, and the choice runs inside at call time, as it does eagerly.

Quantized factors (:class:`svdmlp.int_weights.QuantizedMatrix`) cross the op boundary as their
tensors (values, scales), the scheme's name and each factor's input size, and are rewrapped inside.
"""

from __future__ import annotations

import torch

from svdmlp.backends import choice
from svdmlp.factor_layout import GatedFactors
from svdmlp.int_weights import SCHEMES, QuantizedMatrix, is_quantized

Tensors = list[torch.Tensor]


def _parts(factors) -> tuple[Tensors, Tensors, list[int], str]:
    """Quantized factors as what a custom op can take: values, scales, input sizes, scheme name."""
    return (
        [f.values for f in factors],
        [f.scales for f in factors],
        [f.in_features for f in factors],
        factors[0].scheme.name,
    )


def _rewrapped(
    values: Tensors, scales: Tensors, in_features: list[int], scheme: str
) -> list[QuantizedMatrix]:
    return [
        QuantizedMatrix.around(v, s, SCHEMES[scheme], k)
        for v, s, k in zip(values, scales, in_features, strict=True)
    ]


def _like(x: torch.Tensor, width: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], width))


@torch.library.custom_op("svdmlp::lowrank_gated_mlp", mutates_args=())
def _gated_mlp(
    x: torch.Tensor,
    gate_up_u_t: torch.Tensor,
    gate_v_t: torch.Tensor,
    up_v_t: torch.Tensor,
    down_u_t: torch.Tensor,
    down_v_t: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    return choice.lowrank_gated_mlp(x, gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t, activation)


@_gated_mlp.register_fake
def _(x, gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t, activation):
    return _like(x, down_v_t.shape[1])


@torch.library.custom_op("svdmlp::quantized_gated_mlp", mutates_args=())
def _quantized_gated_mlp(
    x: torch.Tensor, values: Tensors, scales: Tensors, in_features: list[int], scheme: str, activation: str
) -> torch.Tensor:
    return choice.lowrank_gated_mlp(x, *_rewrapped(values, scales, in_features, scheme), activation)


@_quantized_gated_mlp.register_fake
def _(x, values, scales, in_features, scheme, activation):
    return _like(x, values[-1].shape[0])  # stored (N, K)


@torch.library.custom_op("svdmlp::lowrank_linear", mutates_args=())
def _linear(x: torch.Tensor, u_t: torch.Tensor, v_t: torch.Tensor) -> torch.Tensor:
    return choice.lowrank_linear(x, u_t, v_t)


@_linear.register_fake
def _(x, u_t, v_t):
    return _like(x, v_t.shape[1])


@torch.library.custom_op("svdmlp::quantized_lowrank_linear", mutates_args=())
def _quantized_linear(
    x: torch.Tensor, values: Tensors, scales: Tensors, in_features: list[int], scheme: str
) -> torch.Tensor:
    return choice.lowrank_linear(x, *_rewrapped(values, scales, in_features, scheme))


@_quantized_linear.register_fake
def _(x, values, scales, in_features, scheme):
    return _like(x, values[-1].shape[0])


def lowrank_gated_mlp(x, gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t, activation):
    """:func:`svdmlp.backends.choice.lowrank_gated_mlp` as one custom op."""
    factors = GatedFactors(gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t)
    if is_quantized(gate_up_u_t):
        return _quantized_gated_mlp(x, *_parts(factors), activation)
    return _gated_mlp(x, *factors, activation)


def lowrank_linear(x, u_t, v_t):
    """:func:`svdmlp.backends.choice.lowrank_linear` as one custom op."""
    if is_quantized(u_t):
        return _quantized_linear(x, *_parts((u_t, v_t)))
    return _linear(x, u_t, v_t)
