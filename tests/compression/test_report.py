"""The compression record: its round trip through svdmlp.json, its keep, and its plain-text form."""

from __future__ import annotations

import pytest

from conftest import HIDDEN, INTER, SAMPLE_TEXT, tiny_model
from svdmlp import arch, ranks
from svdmlp.compression import pipeline
from svdmlp.compression.report import (
    CompressionReport,
    LayerRecord,
    ProjectionRecord,
    heal_line,
    layer_table,
    summary_line,
)
from svdmlp.config import CalibrationSpec, CompressConfig


def _report(**extra) -> CompressionReport:
    projections = tuple(
        ProjectionRecord(name, HIDDEN, INTER, 16, 0.4167, 0.1 * i, *([0.3, 0.2] if name == "down" else []))
        for i, name in enumerate(arch.PROJECTIONS, 1)
    )
    layers = [
        LayerRecord(0, "model.layers.0.mlp", "compressed", projections=projections),
        LayerRecord(1, "model.layers.1.mlp", "skipped", "not selected by config.layers"),
    ]
    counts = {"params_before": {"total": 1000, "mlp": 600}, "params_after": {"total": 700, "mlp": 300}}
    return CompressionReport(layers=layers, seconds=1.5, **counts, **extra)


def test_round_trip_and_keep():
    report = _report(timings={"calibration": 1.0}, calibration={"tokens": 8, "sha256": "ab"})
    data = report.to_dict()
    assert data["achieved_keep"] == 0.5
    assert CompressionReport.from_dict(data) == report


def test_text_form():
    report = _report()
    table = layer_table(report).splitlines()
    assert table[0].split()[:4] == ["layer", "status", "rank", "gate/up/down"]
    assert table[2].split() == ["0", "compressed", "16/16/16", "0.417/0.417/0.417", "0.100/0.200/0.300"]
    assert table[3].split() == ["1", "skipped:", "not", "selected", "by", "config.layers"]
    assert (
        summary_line(report)
        == "MLP parameters 600 -> 300 (achieved keep 0.5000); model 1,000 -> 700 (0.7000)"
    )
    assert heal_line(report) == (
        "healing (closed-form): mean error of down against the dense MLP output 0.3000 -> 0.2000 over 1 matrices"
    )
    assert heal_line(_report(healing={})).count("lora") == 0


def test_counted_keep_is_the_rank_rules_achieved_keep(tokenizer):
    """The report counts the model's parameters; for bias-free MLPs that is what the ranks achieve."""
    model = tiny_model("llama", num_hidden_layers=3)
    config = CompressConfig(keep=0.5, align=8, calibration=CalibrationSpec("unused", 4, 32), layers=(0, 2))
    report = pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    matrices = []
    for layer in report.layers:
        for name in arch.PROJECTIONS:
            shape = (HIDDEN, INTER) if name != "down" else (INTER, HIDDEN)
            matrices.append((*shape, layer.ranks.get(name)))
    assert report.achieved_keep == pytest.approx(ranks.achieved_keep(matrices))
    assert report.achieved_keep < 1
