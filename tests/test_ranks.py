"""Ranks: the rank rule, achieved keep, keep validation, and the allocation from measured
per-layer divergences (budget, alignment, optimality)."""

import itertools

import pytest
import torch

from svdmlp import ranks


@pytest.mark.parametrize(
    "in_f, out_f, keep, align, expected",
    [
        (576, 1536, 0.8, 32, 320),  # SmolLM2 MLP: 0.8·576·1536/(2112·32) = 10.47 blocks -> 10
        (2048, 8192, 0.8, 128, 1280),  # Llama-3.2-1B up/gate, the paper's align
        (4096, 14336, 0.6, 128, 1920),  # Llama-3.1-8B: 0.6·4096·14336/(18432·128) = 14.9 -> 15 blocks
        (64, 96, 0.01, 8, 8),  # floor: at least one block
        (64, 96, 1.0, 8, 40),  # keep 1 is not lossless: r = in·out/(in+out) = 38.4 -> 40 < 64
    ],
)
def test_rank_rule(in_f, out_f, keep, align, expected):
    assert ranks.rank_for_keep(in_f, out_f, keep, align) == expected
    assert expected % align == 0 and expected < min(in_f, out_f)


def test_rank_rule_below_the_cap():
    # 0.99·100·100/(200·1) = 49.5 -> 50 is below 100; with align 30, round(1.65)=2 -> 60 < 100
    assert ranks.rank_for_keep(100, 100, 1.0, 30) == 60
    # a square 40x40 at keep 1 with align 16: round(20/16)=1 -> 16
    assert ranks.rank_for_keep(40, 40, 1.0, 16) == 16
    # 0.95·48·400 /((448)·8) = 5.09 -> 40 < 48; keep 1 -> 42.9/8 = 5.36 -> 40
    assert ranks.rank_for_keep(48, 400, 1.0, 8) == 40


@pytest.mark.parametrize(
    "in_f, out_f, keep, align, expected",
    [
        # 40·4000/(4040·8) = 4.95 -> 5 blocks = 40 = min(in, out): capped to the block below, 32
        (40, 4000, 1.0, 8, 32),
        (4000, 40, 1.0, 8, 32),  # the rule is symmetric in in and out
        # 0.9·64·4096/(4160·16) = 3.54 -> 4 blocks = 64 = min: capped to 48
        (64, 4096, 0.9, 16, 48),
        # align 7 does not divide min 40: 5 blocks = 35 fit; at keep 1, 40·4000/(4040·7) = 5.66 -> 6
        # blocks = 42 >= 40, capped to (40 - 1) // 7 · 7 = 35
        (40, 4000, 1.0, 7, 35),
    ],
)
def test_rank_is_capped_below_full_rank_on_a_block_boundary(in_f, out_f, keep, align, expected):
    assert ranks.rank_for_keep(in_f, out_f, keep, align) == expected


@pytest.mark.parametrize(
    "keep, align, message",
    [
        (0.0, 8, "keep must be in (0, 1]"),
        (1.5, 8, "keep must be in (0, 1]"),
        (-0.2, 8, "keep"),
        (0.5, 0, "align"),
    ],
)
def test_rank_rule_rejects_bad_input(keep, align, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        ranks.rank_for_keep(64, 96, keep, align)


def test_rank_that_cannot_fit_is_an_error():
    with pytest.raises(ValueError, match="no room for a rank below min"):
        ranks.rank_for_keep(64, 96, 0.5, 64)


def test_achieved_keep_of_one_matrix_and_of_several():
    assert ranks.achieved_keep([(576, 1536, 320)]) == pytest.approx(320 * 2112 / (576 * 1536))
    # A matrix left dense (rank None) counts whole; gate/up and down of different ranks weigh by size.
    mlp = [(576, 1536, 320), (576, 1536, 256), (1536, 576, None)]
    kept = 320 * 2112 + 256 * 2112 + 576 * 1536
    assert ranks.achieved_keep(mlp) == pytest.approx(kept / (3 * 576 * 1536))
    with pytest.raises(ValueError, match="no matrices"):
        ranks.achieved_keep([])


def test_uniform_ranks_apply_the_rule_to_each_matrix():
    shapes = {"gate": (576, 1536), "up": (576, 1536), "down": (1536, 576)}
    assert ranks.uniform_ranks(shapes, 0.8, 32) == {"gate": 320, "up": 320, "down": 320}
    assert ranks.uniform_ranks({"down": (40, 4000)}, 1.0, 8) == {"down": 32}


@pytest.mark.parametrize(
    "keep, error", [(True, TypeError), ("0.8", TypeError), (0.0, ValueError), (1.01, ValueError)]
)
def test_check_keep(keep, error):
    with pytest.raises(error, match="keep"):
        ranks.check_keep(keep)
    assert ranks.check_keep(1) == 1 and ranks.check_keep(0.5) == 0.5


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
    return sum(layer.params(allocation[layer.index]) for layer in layers)


def _predicted(layers, allocation):
    return sum(layer.predicted_kl(allocation[layer.index]) for layer in layers)


@pytest.mark.parametrize("keep", [0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("align", [4, 8])
def test_allocation_meets_the_budget_within_one_block_and_respects_alignment(keep, align):
    allocated = ranks.allocate_layer_ranks(LAYERS, keep, align)
    used = _params(LAYERS, allocated)
    assert used <= ranks.budget(LAYERS, keep)
    assert ranks.budget(LAYERS, keep) - used < min(layer.params(align) for layer in LAYERS) or all(
        allocated[layer.index] is None for layer in LAYERS
    )
    for layer in LAYERS:
        rank = allocated[layer.index]
        assert rank is None or rank % align == 0 and align <= rank <= layer.max_rank(align)


def test_no_rank_stores_more_than_the_dense_matrix_and_a_full_budget_leaves_layers_dense():
    for layer in LAYERS:
        for spectrum in layer.spectra:
            rank = spectrum.max_rank(8)
            assert rank * spectrum.block_params < spectrum.dense_params
            assert (rank + 8) * spectrum.block_params >= spectrum.dense_params
    assert set(ranks.allocate_layer_ranks(LAYERS, 1.0, 8).values()) == {None}


def test_a_layer_near_its_break_even_rank_is_left_dense_when_the_budget_allows():
    """The most sensitive layer reaches its largest saving rank, then goes dense: exact and cheaper
    than the rank past the break-even that it would otherwise want."""
    allocated = ranks.allocate_layer_ranks(LAYERS, 0.8, 4)
    assert allocated[0] is None
    assert LAYERS[0].predicted_kl(None) == 0.0 and LAYERS[0].params(None) == 3 * 64 * 96


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


def test_a_correction_may_start_at_rank_zero_and_an_insensitive_layer_keep_none():
    """Corrections of rounding: rank 0 is the reference (the rounding's measured divergence), and a
    layer whose rounding the model hardly notices may get no correction at all."""
    rounded = [
        ranks.LayerSensitivity(layer.index, layer.spectra, kl, 0)
        for layer, kl in zip(LAYERS, (0.3, 1e-6, 0.05, 1e-6), strict=True)
    ]
    assert rounded[0].predicted_kl(0) == pytest.approx(0.3)
    allocated = ranks.allocate_layer_ranks(rounded, 0.2, 8, start=0)
    assert allocated[1] == allocated[3] == 0 and allocated[0] > 0 and allocated[0] >= allocated[2]
    assert _params(rounded, allocated) <= ranks.budget(rounded, 0.2)


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
    options = [[*range(align, layer.max_rank(align) + 1, align), None] for layer in small]
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


def test_the_planner_the_benchmarks_and_the_pipeline_all_use_the_one_rule(monkeypatch, tokenizer):
    """The rule lives in ranks.rank_for_keep alone: replace it, and every user's ranks follow."""
    from conftest import SAMPLE_TEXT, tiny_model
    from svdmlp.bench import e2e
    from svdmlp.compression import pipeline
    from svdmlp.config import CalibrationSpec, CompressConfig
    from svdmlp.plan.planner import mlp_ranks
    from svdmlp.plan.shapes import BUILTIN

    monkeypatch.setattr(ranks, "rank_for_keep", lambda n_in, n_out, keep, align: 3 * align)
    assert mlp_ranks(BUILTIN["smollm2-135m"], 0.8, 32).as_tuple() == (96, 96, 96)
    assert e2e.install_random_lowrank(tiny_model("llama"), 0.5, 8, "torch") == dict.fromkeys(
        ("gate", "up", "down"), 24
    )
    config = CompressConfig(keep=0.5, align=8, method="svd", calibration=CalibrationSpec("unused", 4, 32))
    report = pipeline.compress(
        tiny_model("qwen2"), tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False
    )
    assert {p.rank for layer in report.layers for p in layer.projections} == {24}
