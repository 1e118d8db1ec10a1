"""Closed-form healing: down fitted by reduced-rank regression to compensate gate/up, checked
against explicit activations and an independent solution."""

from dataclasses import replace

import pytest
import torch

from conftest import SAMPLE_TEXT, tiny_model
from svdmlp import decompose
from svdmlp.activations import activate
from svdmlp.compression import pipeline
from svdmlp.compression.heal import closed_form as heal
from svdmlp.compression.report import CompressionReport
from svdmlp.config import CalibrationSpec, CompressConfig

HIDDEN, INTER, TOKENS = 12, 40, 400


def _mlp(seed: int, gate_up_rank: int):
    """Dense gate/up/down weights, MLP inputs with a non-white spectrum, and rank-limited gate/up."""
    g = torch.Generator().manual_seed(seed)
    gate, up = (torch.randn(INTER, HIDDEN, generator=g) for _ in range(2))
    down = torch.randn(HIDDEN, INTER, generator=g)
    x = torch.randn(TOKENS, HIDDEN, generator=g) @ torch.diag(torch.logspace(0, -1, HIDDEN))
    gate_lr, up_lr = (decompose.plain_svd(w, gate_up_rank) for w in (gate, up))
    return gate, up, down, x.double(), gate_lr, up_lr


def _fn(weight, factors=None):
    m = weight if factors is None else factors.v @ factors.u
    return lambda x: x @ m.T.to(x.dtype)


def _activations(seed, gate_up_rank):
    gate, up, down, x, gate_lr, up_lr = _mlp(seed, gate_up_rank)
    h = activate(x @ gate.double().T, "silu") * (x @ up.double().T)
    m_g, m_u = (f.v.double() @ f.u.double() for f in (gate_lr, up_lr))
    h_tilde = activate(x @ m_g.T, "silu") * (x @ m_u.T)
    grams = heal.down_grams(
        [x.float()[:150], x.float()[150:]],
        (_fn(gate), _fn(up)),
        (_fn(gate, gate_lr), _fn(up, up_lr)),
        "silu",
        dense_gram=h.T @ h,
        weight=down,
    )
    return down, h, h_tilde, grams


def test_down_grams_match_explicit_activations():
    down, h, h_tilde, grams = _activations(0, 6)
    for actual, expected in (
        (grams.compressed, h_tilde.T @ h_tilde),
        (grams.weight_cross, down.double() @ (h_tilde.T @ h).T),  # W·Cᵀ, C never formed
    ):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gate_up_rank", [3, 8])
def test_compensating_down_never_increases_the_error_and_reports_it_exactly(seed, gate_up_rank):
    down, h, h_tilde, grams = _activations(seed, gate_up_rank)
    before = decompose.whitened_svd(down, decompose.Whitening.from_gram(grams.dense), 6)
    healed = heal.compensating_down(down, grams, 6, before)
    assert healed.after < healed.before - 1e-3  # gate/up are far off: compensation must pay
    target = h @ down.double().T
    for factors, error in ((before, healed.before), (healed.factors, healed.after)):
        explicit = target - h_tilde @ (factors.v.double() @ factors.u.double()).T
        assert error == pytest.approx(float(explicit.norm() / target.norm()), rel=1e-4)


def test_compensating_down_is_the_reduced_rank_regression_optimum():
    """Against an independent solution: the best rank-r fit of H·Wᵀ from H̃, by projecting the
    least-squares fit onto the top singular directions of its prediction (Eckart–Young). The fit is a
    ridge regression (the whitening's ridge δ on H̃ᵀH̃), so the independent one is too: H̃ augmented
    by √δ·I, its target by zeros."""
    down, h, h_tilde, grams = _activations(5, 4)
    rank = 5
    healed = heal.compensating_down(down, grams, rank, decompose.plain_svd(down, rank))
    ridge = float(
        (decompose.Whitening.from_gram(grams.compressed).gram() - grams.compressed).diagonal().mean()
    )
    top = float(torch.linalg.eigvalsh(grams.compressed).max())
    assert decompose.RIDGE * top / 2 <= ridge <= decompose.RIDGE * top * (1 + 1e-9)  # power iteration
    inputs = torch.cat([h_tilde, ridge**0.5 * torch.eye(INTER, dtype=torch.float64)])
    target = torch.cat([h @ down.double().T, torch.zeros(INTER, HIDDEN, dtype=torch.float64)])
    coefficients = torch.linalg.lstsq(inputs, target).solution  # (inter, hidden)
    prediction = inputs @ coefficients
    _, _, right_h = torch.linalg.svd(prediction, full_matrices=False)
    projector = right_h[:rank].T @ right_h[:rank]
    best = inputs @ coefficients @ projector
    fitted = inputs @ (healed.factors.v.double() @ healed.factors.u.double()).T
    torch.testing.assert_close(fitted, best, rtol=1e-3, atol=1e-3 * float(best.abs().max()))


def test_exact_gate_and_up_give_the_plain_whitened_svd():
    gate, up, down, x, _, _ = _mlp(3, 6)
    exact = (_fn(gate), _fn(up))
    h = activate(x @ gate.double().T, "silu") * (x @ up.double().T)
    grams = heal.down_grams([x.float()], exact, exact, "silu", dense_gram=h.T @ h, weight=down)
    plain = decompose.whitened_svd(down, decompose.Whitening.from_gram(grams.dense), 6)
    healed = heal.compensating_down(down, grams, 6, plain)
    assert healed.after == pytest.approx(healed.before, rel=1e-5)


def test_report_records_errors_before_and_after_healing(tokenizer):
    config = CompressConfig(
        keep=0.5,
        align=8,
        calibration=CalibrationSpec("text", num_samples=4, seq_len=32),
        sequential=True,
        heal="closed-form",
    )
    report = pipeline.compress(
        tiny_model("llama"), tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False
    )
    records = {p.name: p for layer in report.layers for p in layer.projections if p.name == "down"}
    healed = [p for layer in report.layers for p in layer.projections if p.heal_error_before is not None]
    assert [p.name for p in healed] == ["down", "down"] and records
    assert all(p.heal_error_after <= p.heal_error_before + 1e-9 for p in healed)
    assert CompressionReport.from_dict(report.to_dict()).layers == report.layers
    plain = pipeline.compress(
        tiny_model("llama"),
        tokenizer,
        replace(config, heal="none"),
        calibration_text=SAMPLE_TEXT,
        progress=False,
    )
    assert all(p.heal_error_before is None for layer in plain.layers for p in layer.projections)


def test_closed_form_needs_sequential():
    with pytest.raises(ValueError, match="heal 'closed-form' needs sequential calibration"):
        CompressConfig(heal="closed-form")


def test_a_reloadable_compressed_gram_becomes_its_root_with_the_same_fit():
    down, _, _, grams = _activations(2, 4)
    before = decompose.plain_svd(down, 5)
    copied = heal.compensating_down(down, replace(grams, compressed=grams.compressed.clone()), 5, before)
    saved = grams.compressed.clone()
    consumed = heal.compensating_down(down, grams, 5, before, reload=saved.clone)
    assert grams.compressed is None  # its memory is the root's now
    assert (consumed.before, consumed.after) == pytest.approx((copied.before, copied.after), rel=1e-9)
    torch.testing.assert_close(consumed.factors.u, copied.factors.u, rtol=0, atol=0)
