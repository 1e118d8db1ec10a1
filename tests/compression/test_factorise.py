"""One layer's factorisation: the factors swapped in compute V·U, and the record says what was done."""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, tiny_model
from svdmlp import arch, decompose, ranks
from svdmlp.compression import factorise
from svdmlp.compression.calibration import collect_grams
from svdmlp.lowrank import LowRankGatedMLP, LowRankLinear

IDS = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))


def _replace_weights(model, spec, index, factors) -> None:
    """Give the layer's dense projections their factors' products as weights."""
    for name, pair in factors.items():
        arch.dense_projection(model, spec, index, name).weight.data = pair.v @ pair.u


def test_plain_svd_layer_computes_its_factors_and_records_them():
    model, reference = tiny_model("llama"), tiny_model("llama")
    spec = arch.of_model(model)
    weights = {
        name: arch.dense_projection(model, spec, 1, name).weight.detach().clone() for name in arch.PROJECTIONS
    }
    record = factorise.layer(model, spec, 1, dict.fromkeys(arch.PROJECTIONS, 16), None)
    assert isinstance(getattr(arch.decoder_layers(model, spec)[1], spec.mlp), LowRankGatedMLP)
    assert record.status == "compressed" and record.module == "model.layers.1.mlp"
    factors = {name: decompose.plain_svd(weight, 16) for name, weight in weights.items()}
    for projection in record.projections:
        weight, pair = weights[projection.name], factors[projection.name]
        assert projection.rank == 16
        assert projection.keep == ranks.achieved_keep([(projection.in_features, projection.out_features, 16)])
        assert projection.error == pytest.approx(
            float((weight - pair.v @ pair.u).norm() / weight.norm()), rel=1e-5
        )
    _replace_weights(reference, spec, 1, factors)
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, reference(IDS).logits, rtol=1e-4, atol=1e-5)


def test_whitened_layer_records_the_activation_weighted_error():
    model = tiny_model("qwen2")
    spec = arch.of_model(model)
    windows = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    grams = collect_grams(model, spec, windows, [0], progress=False)[0]
    weight = arch.dense_projection(model, spec, 0, "down").weight.detach().clone()
    record = factorise.layer(model, spec, 0, {"down": 16}, grams)
    down = getattr(getattr(arch.decoder_layers(model, spec)[0], spec.mlp), spec.down)
    assert isinstance(down, LowRankLinear)  # only the projection named: the rest stay dense
    pair = decompose.whitened_svd(weight, grams.whitening("down"), 16)
    expected = decompose.weighted_relative_error(weight, pair, grams.input_gram("down"))
    (projection,) = record.projections
    assert projection.error == pytest.approx(expected, rel=1e-6)
