"""Healing by distillation: the teacher swap, the training loop and its wiring into compress."""

import pytest
import torch

from conftest import SAMPLE_TEXT, tiny_model
from svdmlp import arch, checkpoint, lowrank
from svdmlp.cli import main
from svdmlp.compression import pipeline
from svdmlp.compression.calibration import token_windows
from svdmlp.compression.heal import distill
from svdmlp.compression.report import heal_line
from svdmlp.config import CalibrationSpec, CompressConfig, LoraSpec
from svdmlp.lowrank import LowRankGatedMLP

IDS = torch.randint(0, 300, (1, 16), generator=torch.Generator().manual_seed(1))
CALIB = CalibrationSpec("text", num_samples=4, seq_len=32)


def _compressed(model_type, tokenizer, dtype=torch.float32, keep=0.4):
    """A tiny compressed model and its teacher (taken before compression, as compress does).

    Weights are drawn 5x wider than the default so that the MLPs shape the output distribution.
    """
    model = tiny_model(model_type, initializer_range=0.1).to(dtype)
    spec = arch.resolve(model_type)
    teacher = distill.DenseTeacher(model, spec, [0, 1])
    with torch.no_grad():
        dense = model(IDS).logits
    config = CompressConfig(keep=keep, align=8, calibration=CALIB)
    pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    return model, teacher, dense


def _windows(tokenizer, count, seed):
    return token_windows(tokenizer, SAMPLE_TEXT, count, 32, seed)


@pytest.mark.parametrize("targets", [("gate", "up", "down"), ("up",)])
def test_teacher_swaps_the_dense_mlps_back_and_restores(tokenizer, targets):
    model = tiny_model("qwen2")
    spec = arch.resolve("qwen2")
    teacher = distill.DenseTeacher(model, spec, [0, 1])
    with torch.no_grad():
        dense = model(IDS).logits
    config = CompressConfig(keep=0.4, align=8, calibration=CALIB, targets=targets)
    pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    with torch.no_grad():
        compressed = model(IDS).logits
        with teacher.active():
            torch.testing.assert_close(model(IDS).logits, dense)
        torch.testing.assert_close(model(IDS).logits, compressed)
    assert not torch.allclose(compressed, dense, atol=1e-3)


def test_distillation_lowers_the_calibration_loss_and_touches_only_the_factors(tokenizer):
    model, teacher, _ = _compressed("llama", tokenizer)
    others = {n: p.detach().clone() for n, p in model.named_parameters() if "mlp" not in n}
    factors = {n: p.detach().clone() for n, p in model.named_parameters() if "mlp" in n}
    windows = _windows(tokenizer, 4, 1)
    first = distill.validation_kl(model, teacher, windows[:1])
    result = distill.distill(model, teacher, windows, {"a": windows}, LoraSpec(24, 3e-3, 32), progress=False)
    assert result.kl_after < 0.6 * result.kl_before
    assert len(result.losses) == 24 and result.losses[0] == pytest.approx(
        first, rel=1e-5
    )  # before its update
    assert result.kl_after == pytest.approx(distill.validation_kl(model, teacher, windows))
    assert result.steps == 24 and result.tokens == 24 * 32
    for name, parameter in model.named_parameters():
        if name in others:
            assert torch.equal(parameter, others[name]), name
            assert parameter.requires_grad  # restored as the model came
        else:
            assert not torch.equal(parameter, factors[name]) and not parameter.requires_grad
            assert parameter.grad is None
    assert all(m.backend == "torch" for m in model.modules() if isinstance(m, LowRankGatedMLP))


def test_a_factors_peak_rate_is_its_rms_times_the_relative_rate_unless_one_is_fixed():
    factor = torch.full((8, 4), -0.05)
    assert distill.peak_rate(LoraSpec(relative_lr=1e-3), factor) == pytest.approx(5e-5)
    assert distill.peak_rate(LoraSpec(relative_lr=1e-3), factor * 10) == pytest.approx(5e-4)
    assert distill.peak_rate(LoraSpec(lr=2e-5, relative_lr=1e-3), factor) == 2e-5
    floor = distill.RMS_FLOOR * 1e-3
    assert distill.peak_rate(LoraSpec(relative_lr=1e-3), torch.zeros(3, 3)) == pytest.approx(floor)


# The U-side factors (1) and the V-side ones (-1): U scaled by c and V by 1/c is the same model.
_SIDES = {"u_t": 1, "v_t": -1, "gate_up_u_t": 1, "gate_v_t": -1, "up_v_t": -1, "down_u_t": 1, "down_v_t": -1}


def _rescaled(model, c):
    with torch.no_grad():
        for module in lowrank.lowrank_modules(model):
            for name in module.FACTORS:
                getattr(module, name).mul_(c ** _SIDES[name])
    return model


def test_the_fused_optimizer_takes_adamws_textbook_steps_at_each_factors_rate():
    generator = torch.Generator().manual_seed(0)
    factors = [torch.randn(n, 7, generator=generator) for n in (5, 13)]
    rates, scale = [1e-2, 3e-4], 0.5
    expected = [f.clone() for f in factors]
    moments = [(torch.zeros_like(f), torch.zeros_like(f)) for f in factors]
    optimizer = distill._adamw([f.requires_grad_(True) for f in factors], rates, scale)
    for step in range(1, 4):
        gradients = [torch.randn(f.shape, generator=generator) for f in factors]
        for f, g in zip(factors, gradients, strict=True):
            f.grad = g.clone()
        optimizer.step()
        for k, g in enumerate(gradients):  # AdamW, betas (0.9, 0.999), eps 1e-8, no weight decay
            m, v = moments[k]
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            denominator = (v / (1 - 0.999**step)).sqrt() + 1e-8
            expected[k] -= rates[k] * scale * (m / (1 - 0.9**step)) / denominator
    for f, e in zip(factors, expected, strict=True):
        torch.testing.assert_close(f.detach(), e, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("fixed", [False, True])
def test_the_relative_rate_trains_rescaled_factors_along_the_same_path(tokenizer, fixed):
    model, teacher, _ = _compressed("llama", tokenizer)
    twin, twin_teacher, _ = _compressed("llama", tokenizer)  # the same model, made again
    with torch.no_grad():
        torch.testing.assert_close(_rescaled(twin, 4.0)(IDS).logits, model(IDS).logits, rtol=1e-4, atol=1e-4)
    windows = _windows(tokenizer, 4, 1)
    spec = LoraSpec(6, 1e-3 if fixed else None, 32, relative_lr=1e-2)
    result = distill.distill(model, teacher, windows, {"a": windows}, spec, progress=False)
    rescaled = distill.distill(twin, twin_teacher, windows, {"a": windows}, spec, progress=False)
    if fixed:  # one rate for all: the small factors take relatively larger steps
        assert not result.losses[1:] == pytest.approx(rescaled.losses[1:], rel=1e-3)
        return
    assert rescaled.peak_lr != pytest.approx(result.peak_lr, rel=0.1)  # other rates, the same path:
    assert rescaled.losses == pytest.approx(result.losses, rel=1e-4)
    assert rescaled.kl_after == pytest.approx(result.kl_after, rel=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(
            _rescaled(twin, 1 / 4)(IDS).logits, model(IDS).logits, rtol=1e-3, atol=1e-4
        )


def test_half_precision_factors_train_through_float32_masters(tokenizer):
    model, teacher, _ = _compressed("mistral", tokenizer, dtype=torch.bfloat16)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "mlp" in n}
    windows = _windows(tokenizer, 2, 1)
    result = distill.distill(model, teacher, windows, {"a": windows}, LoraSpec(8, 3e-3, 32), progress=False)
    assert result.kl_after < result.kl_before
    for name, parameter in model.named_parameters():
        if name in before:
            assert parameter.dtype == torch.bfloat16 and not torch.equal(parameter, before[name])


def test_healing_that_raises_the_validation_kl_is_reverted(tokenizer):
    model, teacher, _ = _compressed("llama", tokenizer)
    factors = {n: p.detach().clone() for n, p in model.named_parameters() if "mlp" in n}
    train, validation = _windows(tokenizer, 4, 1), _windows(tokenizer, 2, 2)
    result = distill.distill(model, teacher, train, {"a": validation}, LoraSpec(4, 0.3, 32), progress=False)
    assert result.reverted and result.kl_after > result.kl_before  # the step was far too large
    assert result.to_dict()["reverted"] is True
    for name, parameter in model.named_parameters():
        if name in factors:
            assert torch.equal(parameter, factors[name]), name
    assert distill.validation_kl(model, teacher, validation) == pytest.approx(result.kl_before)


def test_divergence_is_a_clear_error(tokenizer):
    model, teacher, _ = _compressed("llama", tokenizer)
    mlp = next(m for m in model.modules() if isinstance(m, LowRankGatedMLP))
    with torch.no_grad():
        mlp.down_v_t[0, 0] = float("inf")
    with pytest.raises(ValueError, match="healing diverged: the loss is nan at step 0; lower the learning"):
        distill.distill(
            model,
            teacher,
            _windows(tokenizer, 4, 1),
            {"a": _windows(tokenizer, 2, 2)},
            LoraSpec(4, 0.9, 32),
            progress=False,
        )


def test_validation_kl_is_kept_per_source_and_decides_on_their_mean(tokenizer):
    model, teacher, _ = _compressed("llama", tokenizer)
    validation = {"a": _windows(tokenizer, 1, 2), "b": _windows(tokenizer, 2, 3)}
    result = distill.distill(
        model, teacher, _windows(tokenizer, 4, 1), validation, LoraSpec(8, 3e-3, 32), progress=False
    )
    assert sorted(result.kl_by_source) == ["a", "b"]
    per_source = {
        name: distill.validation_kl(model, teacher, windows) for name, windows in validation.items()
    }
    for name, kl in per_source.items():
        assert result.kl_by_source[name]["after"] == pytest.approx(kl)
    assert result.kl_after == pytest.approx(sum(per_source.values()) / 2)  # each source counts once
    assert result.to_dict()["kl_by_source"] == result.kl_by_source


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_validation_kl_by_rows_is_the_kl_of_whole_logits(model_type, tokenizer):
    # Validation forms the student's log-probabilities a few rows at a time; the value must be the
    # mean token KL of the whole logits (Gemma: its softcapping included).
    model, teacher, _ = _compressed(model_type, tokenizer)
    windows = _windows(tokenizer, 3, 2)
    with torch.no_grad():
        with teacher.active():
            dense = model(input_ids=windows).logits
        expected = float(distill.token_kl(model(input_ids=windows).logits, dense))
    assert expected > 1e-4
    assert distill.validation_kl(model, teacher, windows) == pytest.approx(expected, rel=1e-4)


def test_nothing_to_heal_is_an_error(tokenizer):
    model = tiny_model("llama")
    teacher = distill.DenseTeacher(model, arch.resolve("llama"), [0])
    with pytest.raises(ValueError, match="no low-rank MLP modules"):
        distill.distill(
            model,
            teacher,
            _windows(tokenizer, 1, 1),
            {"a": _windows(tokenizer, 1, 2)},
            LoraSpec(1),
            progress=False,
        )


@pytest.mark.parametrize("method", ["whiten", "svd"])
def test_compress_with_lora_records_the_healing(tokenizer, method):
    config = CompressConfig(
        keep=0.4, align=8, method=method, calibration=CALIB, heal="lora", lora=LoraSpec(8, 3e-3, 24)
    )
    model = tiny_model("gemma2", initializer_range=0.1)
    report = pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    healing = report.healing
    assert healing["method"] == "lora" and healing["steps"] == 8 and healing["seq_len"] == 24
    # Validation windows are drawn apart from the training ones; on a random tiny model nothing says
    # the KL there must fall (the calibration loss does: see the test above), only that it is measured.
    assert 0 < healing["kl_before"] < 10 and 0 < healing["kl_after"] < 10 and len(healing["sha256"]) == 64
    assert report.timings["healing"] >= healing["seconds"]  # the step: distillation and its checks
    assert report.seconds == pytest.approx(sum(report.timings.values()))


@pytest.mark.parametrize("rate", [["--heal-lr", "0.001"], ["--heal-relative-lr", "0.002"]])
def test_cli_heal_lora_reaches_the_checkpoint(model_dir, text_file, tmp_path, capsys, rate):
    out = tmp_path / "out"
    argv = ["compress", model_dir, "--calib", text_file, "--out", out, "--align", "8", "--keep", "0.5"]
    argv += ["--effort", "fast"]
    argv += ["--calib-samples", "4", "--calib-seq-len", "32", "--heal", "lora", "--heal-steps", "3"]
    argv += [*rate, "--heal-seq-len", "16"]
    assert main([str(a) for a in argv]) == 0
    printed = capsys.readouterr().out
    metadata = checkpoint.read_metadata(out)
    assert metadata["config"]["heal"] == "lora"
    healing = metadata["report"]["healing"]
    assert healing["steps"] == 3
    if rate[0] == "--heal-lr":
        assert metadata["config"]["lora"] == {"steps": 3, "lr": 0.001, "seq_len": 16, "relative_lr": 3e-4}
        assert "healing (lora): 3 steps of 16 tokens" in printed and "at peak lr 0.001;" in printed
        assert healing["peak_lr"] == [0.001, 0.001]
    else:
        assert metadata["config"]["lora"] == {"steps": 3, "lr": None, "seq_len": 16, "relative_lr": 0.002}
        low, high = healing["peak_lr"]
        assert 0 < low < high and f"at peak lr {low:.2g} to {high:.2g} (0.002 x each factor's RMS)" in printed
    checkpoint.load(out)  # loads like any checkpoint: healing adds no tensors


def test_closed_form_then_lora(tokenizer):
    config = CompressConfig(
        keep=0.4,
        align=8,
        calibration=CALIB,
        sequential=True,
        heal="closed-form+lora",
        lora=LoraSpec(4, 3e-3, 24),
    )
    assert config.heals_closed_form and config.heals_lora
    report = pipeline.compress(
        tiny_model("qwen3", initializer_range=0.1),
        tokenizer,
        config,
        calibration_text=SAMPLE_TEXT,
        progress=False,
    )
    healed = [p.name for layer in report.layers for p in layer.projections if p.heal_error_after is not None]
    assert healed == ["down", "down"] and report.healing["steps"] == 4
    lines = heal_line(report).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "healing (closed-form)",
        "healing (lora)",
        "  training KL by step",
    ]
    assert len(lines[2].split(": ")[1].split()) == 4  # one per step
    with pytest.raises(ValueError, match="heal 'closed-form\\+lora' needs sequential calibration"):
        CompressConfig(heal="closed-form+lora")
