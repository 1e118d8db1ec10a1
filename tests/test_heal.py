"""Closed-form healing: the least-squares V for fixed U, checked against explicit activations."""

from dataclasses import replace

import pytest
import torch

from conftest import SAMPLE_TEXT, tiny_model
from svdmlp import decompose, heal, pipeline
from svdmlp.config import CalibrationSpec, CompressConfig
from svdmlp.report import CompressionReport

OUT, IN, RANK, TOKENS = 24, 40, 8, 300


def _problem(seed: int, drift: float):
    """W, dense inputs X with a non-white spectrum, and X̃ = X + drift·noise (the compressed model's)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(OUT, IN, generator=g)
    x = torch.randn(TOKENS, IN, generator=g) @ torch.diag(torch.logspace(0, -2, IN)) * 3
    x_tilde = x + drift * torch.randn(TOKENS, IN, generator=g)
    return weight, x.double(), x_tilde.double()


def _grams(x, x_tilde):
    return x_tilde.T @ x_tilde, x_tilde.T @ x, x.T @ x  # gram, cross, dense


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("drift", [0.0, 0.05, 0.5])
def test_healing_never_increases_the_calibration_loss(seed, drift):
    weight, x, x_tilde = _problem(seed, drift)
    gram, cross, dense = _grams(x, x_tilde)
    factors = decompose.whitened_svd(weight, decompose.Whitening.from_gram(gram), RANK)
    healed = heal.closed_form(weight, factors, gram, cross, dense)
    assert healed.after <= healed.before + 1e-12
    assert torch.equal(healed.factors.u, factors.u)  # U is kept
    for result, error in ((factors, healed.before), (healed.factors, healed.after)):
        explicit = weight.double() @ x.T - result.v.double() @ result.u.double() @ x_tilde.T
        assert error == pytest.approx(float(explicit.norm() / (weight.double() @ x.T).norm()), rel=1e-5)
    if drift >= 0.5:  # X̃ far from X: the whitened SVD on X̃ alone is not the best V for the dense outputs
        assert healed.after < healed.before - 1e-4


def test_healed_v_is_the_least_squares_solution():
    weight, x, x_tilde = _problem(7, 0.3)
    gram, cross, dense = _grams(x, x_tilde)
    factors = decompose.plain_svd(weight, RANK)
    healed = heal.closed_form(weight, factors, gram, cross, dense)
    design = x_tilde @ factors.u.double().T  # (tokens, r): Vᵀ solves design · Vᵀ ≈ X·Wᵀ
    expected = torch.linalg.lstsq(design, x @ weight.double().T).solution.T
    torch.testing.assert_close(healed.factors.v.double(), expected, rtol=1e-4, atol=1e-5)


def test_one_shot_healing_of_whitened_factors_changes_almost_nothing():
    """With X̃ = X the whitened SVD is already the optimum: healing must not make it worse."""
    weight, x, _ = _problem(3, 0.0)
    gram = x.T @ x
    factors = decompose.whitened_svd(weight, decompose.Whitening.from_gram(gram), RANK)
    healed = heal.closed_form(weight, factors, gram, gram, gram)
    assert healed.after == pytest.approx(healed.before, rel=1e-6)


def test_gram_shapes_are_checked():
    weight, x, x_tilde = _problem(0, 0.1)
    gram, cross, dense = _grams(x, x_tilde)
    factors = decompose.plain_svd(weight, RANK)
    with pytest.raises(
        ValueError, match=r"cross Gram has shape \(39, 39\); the weight's inputs need \(40, 40\)"
    ):
        heal.closed_form(weight, factors, gram, cross[1:, 1:], dense)


@pytest.mark.parametrize("sequential", [False, True])
def test_report_records_errors_before_and_after_healing(tokenizer, sequential):
    config = CompressConfig(
        keep=0.5,
        align=8,
        calibration=CalibrationSpec("text", num_samples=4, seq_len=32),
        sequential=sequential,
        heal="closed-form",
    )
    report = pipeline.compress(
        tiny_model("llama"), tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False
    )
    records = [p for layer in report.layers for p in layer.projections]
    assert len(records) == 6
    assert all(p.heal_error_after <= p.heal_error_before + 1e-9 for p in records)
    assert CompressionReport.from_dict(report.to_dict()).layers == report.layers
    plain = pipeline.compress(
        tiny_model("llama"),
        tokenizer,
        replace(config, heal="none"),
        calibration_text=SAMPLE_TEXT,
        progress=False,
    )
    assert all(p.heal_error_before is None for layer in plain.layers for p in layer.projections)
