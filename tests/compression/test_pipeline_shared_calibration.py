"""Grams and sensitivities collected once and reused across keeps give exactly what a full compress gives."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import SAMPLE_TEXT, count_calls, save_tiny_llama, tiny_model
from svdmlp import decompose, models
from svdmlp.compression import factorise, pipeline, sensitivity
from svdmlp.compression.journal import Journal
from svdmlp.compression.steps.allocation import measure_shared
from svdmlp.compression.steps.calibration import collect_shared
from svdmlp.compression.steps.context import Run
from svdmlp.config import CalibrationSpec, CompressConfig

PLAN = {"model": "tiny"}


def _measure_shared(model, tokenizer, configs, journals, grams=None):
    """:func:`measure_shared` into ``journals``, as the sweep's runner calls it."""
    recorded = [journal.sensitivities() for journal in journals]
    on_measured = [journal.measured for journal in journals]
    measure_shared(model, tokenizer, configs, recorded, on_measured, grams, progress=False)


def _config(keep: float) -> CompressConfig:
    return CompressConfig(keep=keep, align=8, calibration=CalibrationSpec("unused", 4, 32))


def test_precomputed_calibration_matches_a_full_compress(tokenizer, monkeypatch):
    calibration = collect_shared(
        Run(tiny_model("llama"), tokenizer, _config(0.9), SAMPLE_TEXT, progress=False)
    )
    for keep in (0.7, 0.5):
        fresh, shared = tiny_model("llama"), tiny_model("llama")
        expected = pipeline.compress(fresh, tokenizer, _config(keep), SAMPLE_TEXT, progress=False)
        factorisations = count_calls(monkeypatch, decompose.Whitening, "from_gram")
        report = pipeline.compress(shared, tokenizer, _config(keep), progress=False, calibration=calibration)
        # Two Grams per layer, decomposed by the first keep only and kept for the next.
        assert len(factorisations) == (4 if keep == 0.7 else 0)
        monkeypatch.undo()
        assert report.calibration == expected.calibration == calibration.info
        assert report.layers == expected.layers
        for (name, a), (_, b) in zip(fresh.state_dict().items(), shared.state_dict().items(), strict=True):
            assert torch.equal(a, b), name
    assert sorted(calibration.grams) == [0, 1]  # the caller's Grams survive every compress


def test_calibration_missing_a_layer_is_an_error(tokenizer):
    config = CompressConfig(keep=0.5, align=8, calibration=CalibrationSpec("unused", 4, 32), layers=(1,))
    calibration = collect_shared(Run(tiny_model("llama"), tokenizer, config, SAMPLE_TEXT, progress=False))
    with pytest.raises(ValueError, match=r"the calibration given has no Grams for layers \[0\]"):
        pipeline.compress(
            tiny_model("llama"), tokenizer, _config(0.5), progress=False, calibration=calibration
        )


@pytest.mark.parametrize("method", ["whiten", "fisher"])
def test_sensitivities_measured_once_for_several_keeps_equal_each_keeps_own(
    tokenizer, tmp_path, monkeypatch, method
):
    # A sweep's allocations share each layer's Grams and decompositions; each keep's probe, and so
    # its allocation and factors, must be exactly what compressing at that keep alone gives.
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    save_tiny_llama(tmp_path / "model", tokenizer)
    spec = CalibrationSpec(str(text), 4, 32)
    configs = [
        CompressConfig(
            keep=keep, align=8, calibration=spec, method=method, allocation="budget", sequential=True
        )
        for keep in (0.8, 0.5)
    ]

    def load(name):
        (tmp_path / name).mkdir()
        return models.load_for_compression(str(tmp_path / "model"), torch.float32, "cpu", tmp_path / name)[0]

    alone = [pipeline.compress(load(f"alone{c.keep}"), tokenizer, c, progress=False) for c in configs]
    model = load("shared")
    (tmp_path / "grams").mkdir()
    grams = collect_shared(Run(model, tokenizer, configs[0], progress=False), spill=tmp_path / "grams")
    journals = [Journal(tmp_path / f"journal{c.keep}", PLAN) for c in configs]
    divergence = sensitivity.Probe.divergence

    def stopped(probe, index, factors):
        if index == 1:
            raise KeyboardInterrupt
        return divergence(probe, index, factors)

    monkeypatch.setattr(sensitivity.Probe, "divergence", stopped)
    with pytest.raises(KeyboardInterrupt):
        _measure_shared(model, tokenizer, configs, journals, grams)
    assert [sorted(Journal(j.directory, PLAN).sensitivities()) for j in journals] == [[0], [0]]
    monkeypatch.undo()
    decompositions = count_calls(monkeypatch, factorise, "decomposition")
    probes = count_calls(monkeypatch, sensitivity.Probe, "divergence")
    _measure_shared(model, tokenizer, configs, journals, grams)
    assert (len(decompositions), len(probes)) == (3, 2)  # layer 1's, once for both keeps; a probe each
    monkeypatch.undo()
    for config, journal, expected in zip(configs, journals, alone, strict=True):
        probed = count_calls(monkeypatch, sensitivity.Probe, "divergence")
        report = pipeline.compress(
            load(f"shared{config.keep}"),
            tokenizer,
            config,
            progress=False,
            calibration=grams,
            journal=journal,
        )
        assert probed == []  # every layer measured already
        monkeypatch.undo()
        del report.allocation["seconds"], expected.allocation["seconds"]
        assert report.allocation == expected.allocation
        assert report.layers == expected.layers


def test_only_one_plan_at_several_keeps_shares_its_sensitivities(tokenizer, tmp_path):
    spec = CalibrationSpec("unused", 4, 32)
    budget = CompressConfig(keep=0.8, align=8, calibration=spec, allocation="budget", sequential=True)
    journals = [Journal(tmp_path / name, PLAN) for name in "ab"]
    for other in (replace(budget, align=16, keep=0.5), replace(budget, allocation="uniform")):
        configs = [replace(budget, allocation=other.allocation), other]
        with pytest.raises(ValueError, match="budget allocations of one plan at different keeps"):
            _measure_shared(tiny_model("llama"), tokenizer, configs, journals)
    four = [replace(budget, keep=keep) for keep in (0.9, 0.8, 0.7, 0.6)]
    with pytest.raises(ValueError, match="at most 3 keeps' sensitivities are measured at once, got 4"):
        _measure_shared(tiny_model("llama"), tokenizer, four, journals * 2)
