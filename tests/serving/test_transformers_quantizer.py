"""transformers loads svdmlp checkpoints natively: the same model as svdmlp.load, every architecture and
factor width, its bytes the checkpoint's, save_pretrained, generate, pipelines and a PEFT LoRA step;
without svdmlp imported, a clear refusal rather than random weights."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, pipeline

import svdmlp
from conftest import ARCH_CONFIGS, SAMPLE_TEXT, VOCAB, tiny_model
from svdmlp import checkpoint
from svdmlp.compression import pipeline as compression
from svdmlp.config import CalibrationSpec, CompressConfig
from svdmlp.lowrank import LowRankGatedMLP, LowRankLinear
from svdmlp.serving import quant_config


def _save(root, tokenizer, model_type: str = "llama", **overrides):
    """A tiny model of ``model_type`` compressed (keep 0.5) and saved by svdmlp; its directory."""
    text = root / "calib.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    model = tiny_model(model_type)
    config = CompressConfig(keep=0.5, align=8, calibration=CalibrationSpec(str(text), 4, 32), **overrides)
    report = compression.compress(model, tokenizer, config, progress=False)
    return checkpoint.save(root / "ckpt", model, tokenizer, config, report, base_model="tiny")


def _logits(model) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    return _save(tmp_path_factory.mktemp("hf"), tokenizer)


@pytest.mark.parametrize("bits", [16, 8, 4])
@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_from_pretrained_is_svdmlp_load(model_type, bits, tokenizer, tmp_path):
    directory = _save(tmp_path, tokenizer, model_type, factor_bits=bits)
    ours, _ = svdmlp.load(directory)
    theirs = AutoModelForCausalLM.from_pretrained(directory)
    assert theirs.is_quantized and theirs.config.quantization_config.quant_method == "svdmlp"
    assert [type(m).__name__ for m in theirs.modules() if isinstance(m, LowRankGatedMLP)] == [
        "LowRankGatedMLP"
    ] * len(ours.model.layers)
    torch.testing.assert_close(_logits(theirs), _logits(ours), rtol=0, atol=0)


@pytest.mark.parametrize("bits", [16, 8, 4])
def test_bfloat16_and_device_map(saved, tokenizer, tmp_path, bits):
    directory = saved if bits == 16 else _save(tmp_path, tokenizer, factor_bits=bits)
    ours, _ = svdmlp.load(directory, dtype=torch.bfloat16)
    theirs = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16, device_map="cpu")
    assert theirs.dtype == torch.bfloat16
    torch.testing.assert_close(_logits(theirs), _logits(ours), rtol=0, atol=0)


def _checkpoint_bytes(directory) -> int:
    total = 0
    for name in json.loads((directory / "svdmlp.json").read_text())["weights"]["files"]:
        with safe_open(directory / name, framework="pt") as handle:
            for key in handle.keys():
                tensor = handle.get_tensor(key)
                total += tensor.numel() * tensor.element_size()
    return total


def _resident_bytes(model) -> int:
    """Bytes of the weights (tied ones once), not the buffers computed at load (rotary frequencies)."""
    tensors = {t.data_ptr(): t for t in model.state_dict().values()}
    return sum(t.numel() * t.element_size() for t in tensors.values())


@pytest.mark.parametrize("bits", [16, 4])
def test_parameter_bytes_are_the_checkpoints(tokenizer, tmp_path, bits):
    directory = _save(tmp_path, tokenizer, factor_bits=bits)
    model = AutoModelForCausalLM.from_pretrained(directory)  # stored float32: nothing is cast
    assert _resident_bytes(model) == _checkpoint_bytes(directory)


def test_partial_targets_and_skipped_layers(tokenizer, tmp_path):
    directory = _save(tmp_path, tokenizer, targets=("gate", "down"), layers=(1,))
    spec = quant_config.parse(json.loads((directory / "config.json").read_text())["quantization_config"])
    assert set(spec.layers) == {1} and set(spec.layers[1]) == {"gate", "down"}
    model = AutoModelForCausalLM.from_pretrained(directory)
    assert isinstance(model.model.layers[1].mlp.gate_proj, LowRankLinear)
    assert isinstance(model.model.layers[0].mlp.gate_proj, torch.nn.Linear)
    torch.testing.assert_close(_logits(model), _logits(svdmlp.load(directory)[0]), rtol=0, atol=0)


def test_save_pretrained_round_trips(saved, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(saved)
    model.save_pretrained(tmp_path / "again")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    assert isinstance(again.model.layers[0].mlp, LowRankGatedMLP)
    torch.testing.assert_close(_logits(again), _logits(model), rtol=0, atol=0)


def test_generate_and_pipeline(saved, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(saved)
    ours, _ = svdmlp.load(saved)
    prompt = tokenizer("the quick fox", return_tensors="pt")
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    theirs = model.generate(**prompt, **kwargs)
    assert theirs.tolist() == ours.generate(**prompt, **kwargs).tolist()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    text = generator("the quick fox", **kwargs)[0]["generated_text"]
    assert text == tokenizer.decode(theirs[0], skip_special_tokens=True)


def test_a_peft_lora_step_trains_on_top(saved):
    peft = pytest.importorskip("peft")
    model = AutoModelForCausalLM.from_pretrained(saved)
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    before = _logits(lora)
    optimiser = torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.1)
    loss = lora(input_ids=ids, labels=ids).loss
    loss.backward()
    optimiser.step()
    assert not torch.equal(_logits(lora), before)
    assert all(not p.requires_grad for n, p in lora.named_parameters() if "lora_" not in n)


def test_without_svdmlp_transformers_refuses_with_the_package_named(saved):
    code = (
        f"from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained({str(saved)!r})"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "pip install svdmlp, then import svdmlp" in done.stderr


def test_an_unknown_format_version_is_refused(saved, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"]["format_version"] = 99
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="format_version 99; this svdmlp reads 4"):
        AutoModelForCausalLM.from_pretrained(copy)


def test_a_dense_model_is_not_compressed_on_load(model_dir):
    from svdmlp.serving.transformers_quantizer import SvdmlpConfig

    with pytest.raises(ValueError, match="pre-quantized"):
        AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=SvdmlpConfig())


@pytest.mark.slow
def test_a_compressed_smollm2(tmp_path):
    from svdmlp import models

    model, tokenizer, _ = models.load_dense("smollm2-135m", dtype=torch.float32)
    text = tmp_path / "calib.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    config = CompressConfig(
        keep=0.8, align=32, method="whiten", calibration=CalibrationSpec(str(text), 8, 64)
    )
    report = compression.compress(model, tokenizer, config, progress=False)
    directory = checkpoint.save(
        tmp_path / "ckpt", model, tokenizer, config, report, base_model="smollm2-135m", dtype=torch.bfloat16
    )
    for dtype in (torch.float32, torch.bfloat16):
        theirs = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
        torch.testing.assert_close(
            _logits(theirs), _logits(svdmlp.load(directory, dtype=dtype)[0]), rtol=0, atol=0
        )
    assert _resident_bytes(theirs) == _checkpoint_bytes(directory)  # bf16: as stored
