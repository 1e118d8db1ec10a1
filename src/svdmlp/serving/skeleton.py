"""The empty model a checkpoint's weights fill, whichever loader reads them (svdmlp's or transformers'):
the dense architecture with, on the meta device, the modules its ``quantization_config`` names
(:mod:`svdmlp.serving.quant_config`): low-rank MLPs of the recorded ranks, or every MLP projection
quantized with the recorded corrections."""

from __future__ import annotations

import torch
from torch import nn

from svdmlp import arch, lowrank
from svdmlp.int_weights import STORED, factor_scheme
from svdmlp.quantized_linear import install_empty
from svdmlp.serving.quant_config import QuantSpec


def install(model: nn.Module, spec: QuantSpec, dtype: torch.dtype) -> None:
    """Swap in the empty modules of ``spec`` (factors and corrections in ``dtype`` unless quantized)."""
    if spec.weights is None:
        lowrank.install_skeleton(model, spec.layers, dtype, factor_scheme(spec.factor_bits))
        return
    layout = arch.of_model(model)
    for index, layer in enumerate(arch.decoder_layers(model, layout)):
        ranks = spec.layers.get(index, {})
        install_empty(
            getattr(layer, layout.mlp),
            layout,
            STORED[spec.weights],
            ranks,
            dtype,
            factor_scheme(spec.factor_bits),
        )
