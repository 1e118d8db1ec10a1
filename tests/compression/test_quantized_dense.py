"""A dense model's MLP rounded by GPTQ: at most the scheme's values per row, each layer's MLP output closer to
the float one on the calibration windows than round to nearest's."""

import torch

from conftest import SAMPLE_TEXT, tiny_model
from svdmlp import arch
from svdmlp.compression import calibration, sequential
from svdmlp.compression.quantized_dense import quantize_dense_mlps
from svdmlp.config import CalibrationSpec, CompressConfig
from svdmlp.quantize import quantize_mlp


@torch.no_grad()
def _mlp_errors(model, reference, windows) -> list[float]:
    """Each layer's relative MLP output error against ``reference`` on the same MLP inputs."""
    spec = arch.of_model(model)
    errors = []
    for index, _, inputs in sequential.calibrated_layers(
        reference, spec, windows, [0, 1], keep_inputs=True, progress=False
    ):
        ours = getattr(arch.decoder_layers(model, spec)[index], spec.mlp)
        theirs = getattr(arch.decoder_layers(reference, spec)[index], spec.mlp)
        error = sum(float((ours(x) - theirs(x)).square().sum()) for x in inputs)
        errors.append((error / sum(float(theirs(x).square().sum()) for x in inputs)) ** 0.5)
    return errors


def test_gptq_rounds_onto_the_grid_closer_to_the_float_mlp_than_rtn(tokenizer, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    config = CompressConfig(calibration=CalibrationSpec(str(text), 4, 32))
    windows = calibration.config_windows(tokenizer, config, None)
    reference, gptq_model, rtn_model = tiny_model("llama"), tiny_model("llama"), tiny_model("llama")
    info = quantize_dense_mlps(gptq_model, tokenizer, "int8", config, progress=False)
    quantize_mlp(rtn_model, "int8")
    assert info["method"] == "gptq" and info["calibration_tokens"] == windows.numel()
    assert info["mlp_bytes"] == quantize_mlp(tiny_model("llama"), "int8")["mlp_bytes"]
    ours, theirs = _mlp_errors(gptq_model, reference, windows), _mlp_errors(rtn_model, reference, windows)
    assert all(o < t for o, t in zip(ours, theirs, strict=True)), (ours, theirs)
    for weight in (layer.mlp.down_proj.weight for layer in gptq_model.model.layers):
        assert all(len(row.unique()) <= 255 for row in weight)  # int8: at most 255 values a row


def test_a_model_on_disk_is_rounded_by_gptq_as_the_same_model_in_memory(tokenizer, tmp_path):
    import torch

    from conftest import save_tiny_llama
    from svdmlp import models

    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    config = CompressConfig(calibration=CalibrationSpec(str(text), 4, 32))
    save_tiny_llama(tmp_path / "model", tokenizer)
    (tmp_path / "scratch").mkdir()
    on_disk, _, _ = models.load_lazy(str(tmp_path / "model"), scratch=tmp_path / "scratch")
    in_memory, _, _ = models.load_dense(str(tmp_path / "model"))
    ours = quantize_dense_mlps(on_disk, tokenizer, "int4", config, progress=False)
    theirs = quantize_dense_mlps(in_memory, tokenizer, "int4", config, progress=False)
    assert ours == theirs
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 11, 2]])
    with torch.no_grad():
        assert torch.allclose(on_disk(ids).logits, in_memory(ids).logits, atol=1e-5)


def test_a_low_rank_correction_brings_each_mlp_closer_to_the_float_one(tokenizer, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    config = CompressConfig(calibration=CalibrationSpec(str(text), 4, 32), align=8)
    windows = calibration.config_windows(tokenizer, config, None)
    reference, plain, fixed = tiny_model("llama"), tiny_model("llama"), tiny_model("llama")
    bare = quantize_dense_mlps(plain, tokenizer, "int2g16", config, progress=False)
    info = quantize_dense_mlps(fixed, tokenizer, "int2g16", config, progress=False, correction_keep=0.2)
    assert info["correction_keep"] == 0.2 and info["correction_rounds"] >= 0
    assert info["mlp_bytes"] == bare["mlp_bytes"] + 2 * info["correction_params"]
    ours, theirs = _mlp_errors(fixed, reference, windows), _mlp_errors(plain, reference, windows)
    assert all(o < t for o, t in zip(ours, theirs, strict=True)), (ours, theirs)
