import itertools

import pytest
import torch

from svdmlp import ranks
from svdmlp.decompose import kept_fraction


def _spectrum(name, in_f, out_f, decay, seed=0):
    k = min(in_f, out_f)
    energy = torch.logspace(0, -decay, k, dtype=torch.float64)
    energy *= 1 + 0.1 * torch.rand(k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return ranks.Spectrum(name, in_f, out_f, energy.sort(descending=True).values)


SPECTRA = [
    _spectrum("flat", 64, 96, 0.5),
    _spectrum("steep", 64, 96, 6.0, seed=1),
    _spectrum("mid", 96, 64, 2.0, seed=2),
    _spectrum("wide", 48, 160, 3.0, seed=3),
]


@pytest.mark.parametrize("keep", [0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("align", [4, 8])
def test_allocation_meets_the_budget_within_one_block_and_respects_alignment(keep, align):
    allocated = ranks.allocate_ranks(SPECTRA, keep, align)
    used = sum(allocated[s.name] * s.block_params for s in SPECTRA)
    cheapest_block = min(align * s.block_params for s in SPECTRA)
    assert used <= ranks.budget(SPECTRA, keep)
    assert ranks.budget(SPECTRA, keep) - used < cheapest_block or all(
        allocated[s.name] == s.max_rank(align) for s in SPECTRA
    )
    for s in SPECTRA:
        assert allocated[s.name] % align == 0 and align <= allocated[s.name] <= s.max_rank(align)


def test_steep_spectra_get_fewer_ranks_than_flat_ones():
    allocated = ranks.allocate_ranks(SPECTRA, 0.5, 8)
    assert allocated["steep"] < allocated["flat"]


def _total_error(spectra, allocation):
    return sum(s.relative_error(allocation[s.name]) ** 2 for s in spectra)


def test_allocation_beats_uniform_at_no_more_parameters():
    for keep in (0.4, 0.6, 0.8):
        uniform = ranks.uniform_ranks(SPECTRA, keep, 8)
        uniform_params = sum(uniform[s.name] * s.block_params for s in SPECTRA)
        keep_of_uniform = uniform_params / sum(s.in_features * s.out_features for s in SPECTRA)
        allocated = ranks.allocate_ranks(SPECTRA, keep_of_uniform, 8)
        assert sum(allocated[s.name] * s.block_params for s in SPECTRA) <= uniform_params
        assert _total_error(SPECTRA, allocated) <= _total_error(SPECTRA, uniform) + 1e-12


def test_greedy_is_optimal_on_small_cases_by_exhaustive_search():
    small = [
        _spectrum("a", 16, 24, 1.0),
        _spectrum("b", 24, 16, 4.0, seed=1),
        _spectrum("c", 16, 16, 2.0, seed=2),
    ]
    align, keep = 4, 0.6
    limit = ranks.budget(small, keep)
    options = [range(align, s.max_rank(align) + 1, align) for s in small]
    best = min(
        _total_error(small, dict(zip("abc", combo, strict=True)))
        for combo in itertools.product(*options)
        if sum(r * s.block_params for r, s in zip(combo, small, strict=True)) <= limit
    )
    assert _total_error(small, ranks.allocate_ranks(small, keep, align)) == pytest.approx(best)


def test_uniform_ranks_follow_the_rank_rule():
    uniform = ranks.uniform_ranks(SPECTRA, 0.5, 8)
    assert uniform["flat"] == 16 and kept_fraction(64, 96, 16) == pytest.approx(16 * 160 / 6144)


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
        ranks.allocate_ranks(SPECTRA, keep, align)
