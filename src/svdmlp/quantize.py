"""Weight-only quantization of a model's MLP in place, for evaluation: the baseline users compare every
compression with ("why not just quantize?"), and a compressed model's factors quantized the same way.

Fake quantization: each weight is quantized by a scheme of :mod:`svdmlp.int_weights` and replaced by the
value it stands for, exactly what an int8/int4 kernel would multiply by; the bytes counted are the
packed ones. A compressed model's factors are quantized along the dimension each sums over. For
checkpoints whose factors are stored quantized (``svdmlp compress --factor-bits``), see
:func:`svdmlp.lowrank.quantize_factors`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from svdmlp import arch, lazy
from svdmlp.config import FACTOR_BITS, checked_keep
from svdmlp.int_weights import FakeQuantization, quantize, scheme
from svdmlp.lowrank import LowRankGatedMLP, LowRankLinear


@dataclass(frozen=True)
class Quantization:
    """A quantized dense MLP by name, ``SCHEME[-gptq][+KEEP[-int8|-int4]]`` (a sweep's baseline, a speed
    bench's variant): the MLP weights rounded to nearest by a scheme of :func:`svdmlp.int_weights.scheme`
    (``int4``, ``int3-asym``, ``int2g64-asym``), or by GPTQ on the calibration windows (``-gptq``), with a
    low-rank correction keeping ``KEEP`` of each weight's parameters (``+KEEP``), its factors in bf16 or
    stored int8 or int4 as ``--factor-bits`` stores factors (``+0.05-int8``), as ``svdmlp eval --quantize
    S [--gptq] [--correction-keep K]`` and ``svdmlp compress --quantize S --correction-keep K
    --factor-bits B``."""

    scheme: str
    gptq: bool = False
    correction_keep: float = 0.0
    correction_bits: int = 16

    @classmethod
    def parse(cls, spec: str, fitted: bool = True) -> Quantization:
        """``spec`` read; a correction is fitted on calibration, so it needs GPTQ's, unless not
        ``fitted`` (a speed bench's random factors)."""
        rest, plus, correction = spec.partition("+")
        name = rest.removesuffix("-gptq")
        scheme(name)  # names a bad scheme
        gptq = name != rest
        if not plus:
            return cls(name, gptq)
        if fitted and not gptq:
            raise ValueError(
                f"quantization {spec!r}: a correction is fitted on calibration: {name}-gptq+{correction}"
            )
        keep, bits = correction, 16
        for width, bits_name in FACTOR_BITS.items():
            if bits_name is not None and correction.endswith(f"-{bits_name}"):
                keep, bits = correction.removesuffix(f"-{bits_name}"), width
        try:
            return cls(name, gptq, checked_keep(float(keep)), bits)
        except ValueError:
            raise ValueError(
                f"quantization {spec!r}: the correction is KEEP, a number in (0, 1], or KEEP-int8 or "
                "KEEP-int4 for its factors stored quantized"
            ) from None

    @property
    def label(self) -> str:
        """How a table or plot names it: ``int4 GPTQ + correction 0.05 (int8)``."""
        text = f"{self.scheme} {'GPTQ' if self.gptq else 'RTN'}"
        if self.correction_keep:
            bits = "" if self.correction_bits == 16 else f" ({FACTOR_BITS[self.correction_bits]})"
            text += f" + correction {self.correction_keep:g}{bits}"
        return text


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
