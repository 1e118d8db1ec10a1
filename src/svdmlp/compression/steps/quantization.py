"""Quantization of the factors (``--factor-bits 8|4``), after healing: GPTQ on the calibration windows
(plain SVD's: rounded to nearest). Its time and memory are small beside the other steps' and are not
predicted."""

from __future__ import annotations

import torch.nn as nn

from svdmlp import arch, corpora
from svdmlp.compression import quantized_factors
from svdmlp.compression.calibration import config_windows
from svdmlp.compression.steps.context import Run
from svdmlp.config import CompressConfig
from svdmlp.int_weights import factor_scheme


def needed(run: Run) -> bool:
    return factor_scheme(run.config.factor_bits) is not None


def quantize(run: Run) -> dict:
    """Quantize every compressed layer's factors as ``run.config.factor_bits`` says; the report's record."""
    windows = run.windows() if run.config.needs_calibration else None  # plain SVD draws no windows
    how = factor_scheme(run.config.factor_bits)
    return quantized_factors.quantize_layers(
        run.model, run.spec, run.layers, how, windows, run.store, run.progress
    )


def quantize_checkpoint(model: nn.Module, tokenizer, config: CompressConfig, progress: bool = True) -> dict:
    """Quantize the factors of an already compressed ``model`` (a checkpoint's) as
    ``config.factor_bits`` says, calibrated on the windows that compressing with ``config`` drew (the
    same sources, count, length and seed; plain SVD's: rounded to nearest); the report's ``quantization``."""
    how = factor_scheme(config.factor_bits)
    if how is None:
        raise ValueError("factor bits 16 keep the factors in floating point: nothing to quantize")
    spec = arch.of_model(model)
    windows = None
    if config.needs_calibration:
        if corpora.SELF in dict(config.calibration.mixture):
            raise ValueError(
                "this checkpoint was calibrated on the dense model's own samples, which only the dense "
                "model can draw: compress again with --factor-bits instead"
            )
        windows = config_windows(tokenizer, config, None, bos=arch.bos_token_id(spec, tokenizer))
    layers = arch.decoder_layers(model, spec)
    return quantized_factors.quantize_layers(model, spec, layers, how, windows, lambda index: None, progress)
