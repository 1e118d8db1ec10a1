"""Grams collected once and reused across keeps give exactly what a full compress gives."""

from __future__ import annotations

import pytest
import torch

from conftest import SAMPLE_TEXT, count_calls, tiny_model
from svdmlp.compression import decompose, pipeline
from svdmlp.config import CalibrationSpec, CompressConfig


def _config(keep: float) -> CompressConfig:
    return CompressConfig(keep=keep, align=8, calibration=CalibrationSpec("unused", 4, 32))


def test_precomputed_calibration_matches_a_full_compress(tokenizer, monkeypatch):
    calibration = pipeline.collect_calibration(
        tiny_model("llama"), tokenizer, _config(0.9), SAMPLE_TEXT, progress=False
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
    calibration = pipeline.collect_calibration(
        tiny_model("llama"), tokenizer, config, SAMPLE_TEXT, progress=False
    )
    with pytest.raises(ValueError, match=r"the calibration given has no Grams for layers \[0\]"):
        pipeline.compress(
            tiny_model("llama"), tokenizer, _config(0.5), progress=False, calibration=calibration
        )
