"""Rank allocation from measured per-layer divergences: budget, alignment, optimality."""

import itertools

import pytest
import torch

from svdmlp import ranks


def _spectrum(name, in_f, out_f, decay, seed=0):
    k = min(in_f, out_f)
    energy = torch.logspace(0, -decay, k, dtype=torch.float64)
    energy *= 1 + 0.1 * torch.rand(k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return ranks.Spectrum(name, in_f, out_f, energy.sort(descending=True).values)


def _layer(index, decay, kl, reference=16, hidden=64, inter=96):
    """A GLU MLP's gate, up (hidden -> inter) and down (inter -> hidden) with one spectrum shape."""
    spectra = (
        _spectrum(f"{index}.gate", hidden, inter, decay, seed=3 * index),
        _spectrum(f"{index}.up", hidden, inter, decay, seed=3 * index + 1),
        _spectrum(f"{index}.down", inter, hidden, decay, seed=3 * index + 2),
    )
    return ranks.LayerSensitivity(index, spectra, kl, reference)


LAYERS = [_layer(0, 1.0, 0.30), _layer(1, 3.0, 0.02), _layer(2, 0.5, 0.05), _layer(3, 2.0, 0.01)]


def _params(layers, allocation):
    return sum(allocation[layer.index] * sum(s.block_params for s in layer.spectra) for layer in layers)


def _predicted(layers, allocation):
    return sum(layer.predicted_kl(allocation[layer.index]) for layer in layers)


@pytest.mark.parametrize("keep", [0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("align", [4, 8])
def test_allocation_meets_the_budget_within_one_block_and_respects_alignment(keep, align):
    allocated = ranks.allocate_layer_ranks(LAYERS, keep, align)
    used = _params(LAYERS, allocated)
    assert used <= ranks.budget(LAYERS, keep)
    assert ranks.budget(LAYERS, keep) - used < min(layer.block_cost(align) for layer in LAYERS) or all(
        allocated[layer.index] == layer.max_rank(align) for layer in LAYERS
    )
    for layer in LAYERS:
        assert allocated[layer.index] % align == 0 and align <= allocated[layer.index] <= layer.max_rank(
            align
        )


def test_the_prediction_passes_through_the_measurement_and_falls_with_rank():
    layer = LAYERS[0]
    assert layer.predicted_kl(layer.reference_rank) == pytest.approx(layer.kl)
    curve = [layer.predicted_kl(r) for r in range(8, 64, 8)]
    assert curve == sorted(curve, reverse=True)
    exact = ranks.LayerSensitivity(9, (ranks.Spectrum("9.gate", 64, 96, torch.zeros(64)),), 0.0, 16)
    assert exact.predicted_kl(8) == 0.0  # nothing to lose: no division by a zero error


def test_a_more_sensitive_layer_gets_more_rank():
    twins = [_layer(0, 1.0, 0.01), _layer(1, 1.0, 0.2)]
    twins[1] = ranks.LayerSensitivity(1, twins[0].spectra, 0.2, 16)  # same spectra, 20x the measured KL
    allocated = ranks.allocate_layer_ranks(twins, 0.4, 8)
    assert allocated[1] > allocated[0]


def test_allocation_is_never_predicted_worse_than_uniform_ranks():
    for keep in (0.2, 0.3, 0.45):
        uniform = {layer.index: 8 * round(keep * 64 * 96 / (160 * 8)) for layer in LAYERS}
        allocated = ranks.allocate_layer_ranks(LAYERS, _params(LAYERS, uniform) / (4 * 3 * 64 * 96), 8)
        assert _params(LAYERS, allocated) <= _params(LAYERS, uniform)
        assert _predicted(LAYERS, allocated) <= _predicted(LAYERS, uniform) + 1e-12


def test_greedy_is_optimal_on_small_cases_by_exhaustive_search():
    small = [_layer(0, 1.0, 0.3, hidden=16, inter=24), _layer(1, 4.0, 0.05, hidden=16, inter=24)]
    small.append(_layer(2, 2.0, 0.1, hidden=16, inter=24))
    align, keep = 4, 0.6
    limit = ranks.budget(small, keep)
    options = [range(align, layer.max_rank(align) + 1, align) for layer in small]
    best = min(
        _predicted(small, dict(enumerate(combo)))
        for combo in itertools.product(*options)
        if _params(small, dict(enumerate(combo))) <= limit
    )
    assert _predicted(small, ranks.allocate_layer_ranks(small, keep, align)) == pytest.approx(best)


@pytest.mark.parametrize(
    "keep, align, message",
    [
        (0.0, 8, r"keep must be in \(0, 1\]"),
        (0.5, 0, "align must be"),
        (0.01, 8, "below one block"),
        (0.5, 64, "no room"),
    ],
)
def test_bad_input(keep, align, message):
    with pytest.raises(ValueError, match=message):
        ranks.allocate_layer_ranks(LAYERS, keep, align)


def test_no_layers():
    with pytest.raises(ValueError, match="no layers"):
        ranks.allocate_layer_ranks([], 0.5, 8)
