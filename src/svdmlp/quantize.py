"""Weight-only quantization of a model's MLP in place, for evaluation: the baseline users compare every
compression with ("why not just quantize?"), and a compressed model's factors quantized the same way.

Fake quantization: each weight is quantized by a scheme of :mod:`svdmlp.int_weights` and replaced by the
value it stands for, exactly what an int8/int4 kernel would multiply by; the bytes counted are the
packed ones. A compressed model's factors are quantized along the dimension each sums over. For
checkpoints whose factors are stored quantized (``svdmlp compress --factor-bits``), see
:func:`svdmlp.lowrank.quantize_factors`.
"""

from __future__ import annotations

import torch
from torch import nn

from svdmlp import arch, lazy
from svdmlp.int_weights import FakeQuantization, quantize, scheme
from svdmlp.lowrank import LowRankGatedMLP, LowRankLinear


def _mlp_weights(mlp: nn.Module):
    """Every weight of one MLP as a 2-D view whose rows are outputs and columns the inputs they sum
    over: a dense projection's weight as it is, a low-rank factor ``(k, n)`` transposed."""
    for module in mlp.modules():
        if isinstance(module, nn.Linear):
            yield module.weight
        elif isinstance(module, (LowRankLinear, LowRankGatedMLP)):
            yield from (factor.T for factor in module.parameters(recurse=False))


@torch.no_grad()
def quantize_mlp(model: nn.Module, name: str) -> dict:
    """Replace every MLP weight of ``model`` (dense projections, or a compressed layer's factors) by its
    quantized value, in place, one layer at a time (a model on disk has each layer written back); what
    it cost.

    Returns:
        The scheme, the MLP's bytes quantized and in bf16, and the largest relative error of one
        weight (Frobenius norm).
    """
    how = scheme(name)
    tally = FakeQuantization(how)
    spec = arch.of_model(model)
    for layer in arch.decoder_layers(model, spec):
        with lazy.held(model, layer):
            for weight in _mlp_weights(getattr(layer, spec.mlp)):
                tally.replace(weight, *quantize(weight, how))
            lazy.store(model, layer)
    return tally.report()
