"""The empty model a checkpoint's weights fill, whichever loader reads them (svdmlp's or transformers'):
the dense architecture with, on the meta device, the modules its ``quantization_config`` names
(:mod:`svdmlp.serving.quant_config`): low-rank MLPs of the recorded ranks, or every MLP projection
quantized with the recorded corrections."""

from __future__ import annotations

import torch
from torch import nn

from svdmlp import arch, lowrank
from svdmlp.int_weights import STORED, factor_scheme
from svdmlp.quantized_linear import QuantizedLinear
from svdmlp.serving.quant_config import QuantSpec


def install(model: nn.Module, spec: QuantSpec, dtype: torch.dtype) -> None:
    """Swap in the empty modules of ``spec`` (factors and corrections in ``dtype`` unless quantized)."""
    if spec.weights is None:
        lowrank.install_skeleton(model, spec.layers, dtype, factor_scheme(spec.factor_bits))
        return
    how = STORED[spec.weights]
    layout = arch.of_model(model)
    for index, layer in enumerate(arch.decoder_layers(model, layout)):
        mlp = getattr(layer, layout.mlp)
        ranks = spec.layers.get(index, {})
        for name in arch.PROJECTIONS:
            dense = getattr(mlp, layout.projection(name))
            empty = QuantizedLinear(
                dense.in_features,
                dense.out_features,
                how,
                ranks.get(name, 0),
                dtype,
                "meta",
                factor_scheme(spec.factor_bits),
            )
            setattr(mlp, layout.projection(name), empty)
