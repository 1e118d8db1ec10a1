"""Factors quantized with the calibration inputs: GPTQ for each shrink factor, a closed-form refit and
GPTQ for each expand factor, one layer at a time on the quantized model's own hidden states."""

import pytest
import torch

from conftest import SAMPLE_TEXT, tiny_model
from svdmlp import arch, lowrank
from svdmlp.backends import torch_ref
from svdmlp.compression import calibration, pipeline, quantized_factors, sequential
from svdmlp.compression.steps.quantization import quantize_checkpoint
from svdmlp.config import CalibrationSpec, CompressConfig
from svdmlp.int_weights import SCHEMES

CALIB = CalibrationSpec("unused: text passed directly", num_samples=4, seq_len=32)


def _compressed(tokenizer, model_type="llama", **kwargs):
    model = tiny_model(model_type)
    config = CompressConfig(keep=0.5, align=8, calibration=CALIB, method="whiten", **kwargs)
    pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    windows = calibration.config_windows(tokenizer, config, SAMPLE_TEXT)
    return model, windows


def _outputs(module, x):
    """The module's output, its factors dequantized (float32) or as they are."""
    factors = [
        f.dequantized().T if hasattr(f, "dequantized") else f
        for f in (getattr(module, n) for n in module.FACTORS)
    ]
    if isinstance(module, lowrank.LowRankLinear):
        return torch_ref.lowrank_linear(x, *factors)
    return torch_ref.lowrank_gated_mlp(x, *factors, module.activation)


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("targets", [("gate", "up", "down"), ("gate", "down")])
def test_calibrated_quantization_beats_round_to_nearest_on_its_windows(tokenizer, name, targets):
    model, windows = _compressed(tokenizer, targets=targets)
    spec = arch.of_model(model)
    layers = arch.decoder_layers(model, spec)
    # What every module sees on the float model, and its float output: the reference errors are taken on.
    seen = {}
    for index, inputs in sequential.lowrank_inputs(model, spec, windows, [0, 1], progress=False):
        seen.update({(index, n): (m, [x.clone() for x in xs]) for n, (m, xs) in enumerate(inputs.items())})
    floats = {key: [_outputs(m, x.float()) for x in xs] for key, (m, xs) in seen.items()}
    report = quantized_factors.quantize_layers(
        model, spec, layers, SCHEMES[name], windows, lambda i: None, False
    )
    assert report["method"] == "gptq+refit" and report["scheme"] == name
    assert report["output_error_mean"] < report["rtn_error_mean"]
    assert report["output_error_max"] < 0.05 if name == "int8" else 0.5
    assert all(m.scheme is SCHEMES[name] for m in lowrank.lowrank_modules(model))
    # Layer 0 sees the same inputs as before, so its stored factors give the error the report implies.
    for key, (module, xs) in seen.items():
        if key[0] == 0:
            references = floats[key]
            error = sum((_outputs(module, x) - y).square().sum() for x, y in zip(xs, references, strict=True))
            norm = sum(y.square().sum() for y in references)
            assert float((error / norm).sqrt()) <= report["output_error_max"] + 1e-6


def test_without_windows_the_factors_are_rounded_to_nearest(tokenizer):
    model, _ = _compressed(tokenizer)
    expected = {}
    for module in lowrank.lowrank_modules(model):
        for n in module.FACTORS:
            expected[(id(module), n)] = lowrank.QuantizedMatrix.of(
                getattr(module, n).detach(), SCHEMES["int4"]
            )
    spec = arch.of_model(model)
    report = quantized_factors.quantize_layers(
        model, spec, arch.decoder_layers(model, spec), SCHEMES["int4"], None, lambda i: None, False
    )
    assert report["method"] == "rtn" and 0 < report["weight_error_mean"] <= report["weight_error_max"] < 0.5
    for module in lowrank.lowrank_modules(model):
        for n in module.FACTORS:
            assert torch.equal(getattr(module, n).values, expected[(id(module), n)].values)


def test_a_checkpoints_factors_are_quantized_on_the_windows_it_was_compressed_with(tokenizer):
    model, windows = _compressed(tokenizer)
    config = CompressConfig(keep=0.5, align=8, calibration=CALIB, method="whiten", factor_bits=4)
    with pytest.raises(ValueError, match="nothing to quantize"):
        quantize_checkpoint(model, tokenizer, CompressConfig(factor_bits=16))
    selfish = CompressConfig(calibration=CalibrationSpec("self"), factor_bits=4)
    with pytest.raises(ValueError, match="only the dense model can draw"):
        quantize_checkpoint(model, tokenizer, selfish)
    assert config.needs_calibration and windows.shape[0] == CALIB.num_samples
