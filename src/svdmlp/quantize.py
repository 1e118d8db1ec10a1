"""Weight-only round-to-nearest (RTN) quantization of the MLP weights: the baseline users compare every
compression with ("why not just quantize?").

Schemes, symmetric, scales in fp16 (their bytes counted):
- ``int8``: one scale per output channel: ``1 + 2/in`` bytes per weight;
- ``int4``: one scale per group of 128 consecutive inputs of a row: ``0.5 + 2/128`` bytes per weight.
RTN is the baseline of the literature's tables (llama.cpp's Q8_0 and Q4_0 are block RTN; AWQ and GPTQ
improve on it with calibration). A compressed model's factors are quantized the same way, each along the
dimension it sums over: SVD and quantization together. Evaluation quantizes and dequantizes in place (fake
quantization): the values are exactly those an int8/int4 kernel would multiply by; the bytes are the
packed ones. No kernel reads packed factors yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from svdmlp import arch
from svdmlp.lowrank import LowRankGatedMLP, LowRankLinear

SCALE_BYTES = 2  # fp16


@dataclass(frozen=True)
class Scheme:
    name: str
    bits: int
    group: int | None  # inputs per scale; None: the whole row (per output channel)

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1

    def nbytes(self, rows: int, cols: int) -> int:
        """Bytes of a quantized ``rows × cols`` weight, packed values and scales."""
        groups = 1 if self.group is None else -(-cols // self.group)
        return -(-rows * cols * self.bits // 8) + rows * groups * SCALE_BYTES


SCHEMES = {"int8": Scheme("int8", 8, None), "int4": Scheme("int4", 4, 128)}


def scheme(name: str) -> Scheme:
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown quantization {name!r}; expected one of {sorted(SCHEMES)}") from None


def quantize(weight: torch.Tensor, how: Scheme) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)``: integers in ``[-qmax, qmax]`` (int8, one per weight) and fp16 scales, one per
    row and group, with ``weight ≈ q · scale`` (error at most half a scale per weight)."""
    if weight.dim() != 2:
        raise ValueError(f"quantize needs a 2-D weight, got shape {tuple(weight.shape)}")
    if not torch.isfinite(weight).all():
        raise ValueError("the weight holds NaN or infinite values; it cannot be quantized")
    groups = _grouped(weight.float(), how)
    scales = (groups.abs().amax(-1, keepdim=True) / how.qmax).to(torch.float16)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero group: any scale
    q = torch.round(groups / scales.float()).clamp(-how.qmax, how.qmax).to(torch.int8)
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The float32 weight of ``shape`` that ``(q, scales)`` stand for."""
    rows, cols = shape
    return (q.float() * scales.float()).reshape(rows, -1)[:, :cols]


def _grouped(weight: torch.Tensor, how: Scheme) -> torch.Tensor:
    """``(rows, groups, group)`` view of ``weight``, the last group padded with zeros."""
    rows, cols = weight.shape
    group = cols if how.group is None else how.group
    padding = -cols % group
    if padding:
        weight = torch.nn.functional.pad(weight, (0, padding))
    return weight.reshape(rows, -1, group)


def _mlp_weights(model: nn.Module):
    """Every MLP weight of the decoder layers as a 2-D view whose rows are outputs and columns the
    inputs they sum over: a dense projection's weight as it is, a low-rank factor ``(k, n)`` transposed."""
    spec = arch.of_model(model)
    for layer in arch.decoder_layers(model, spec):
        for module in getattr(layer, spec.mlp).modules():
            if isinstance(module, nn.Linear):
                yield module.weight
            elif isinstance(module, (LowRankLinear, LowRankGatedMLP)):
                yield from (factor.T for factor in module.parameters(recurse=False))


@torch.no_grad()
def quantize_mlp(model: nn.Module, name: str) -> dict:
    """Replace every MLP weight of ``model`` (dense projections, or a compressed layer's factors) by its
    quantized value, in place; what it cost.

    Returns:
        The scheme, the MLP's bytes quantized and in bf16, and the largest relative error of one
        weight (Frobenius norm).
    """
    how = scheme(name)
    quantized = bf16 = 0
    worst = 0.0
    for weight in _mlp_weights(model):
        q, scales = quantize(weight, how)
        restored = dequantize(q, scales, tuple(weight.shape))
        error = (restored - weight.float()).norm() / weight.float().norm().clamp_min(1e-30)
        worst = max(worst, float(error))
        weight.copy_(restored.to(weight.dtype))
        quantized += how.nbytes(*weight.shape)
        bf16 += 2 * weight.numel()
    return {
        "scheme": how.name,
        "bits": how.bits,
        "group": how.group,
        "mlp_bytes": quantized,
        "mlp_bytes_bf16": bf16,
        "max_rel_error": worst,
    }
