"""Rank allocation: which rank each matrix gets, uniformly or under one global parameter budget.

Pure math on spectra: no modules, hooks or files. A matrix's *spectrum* here is the squared singular
values ``σ²`` of its whitened form ``W·S`` (``S`` the root of the calibration Gram), so that the
activation-weighted truncation error of rank ``r`` is ``Σ_{i≥r} σ_i²`` and its relative value is
that over ``Σ σ_i²``: exactly the error :func:`svdmlp.decompose.whitened_svd` leaves.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from svdmlp.decompose import rank_for_keep


@dataclass(frozen=True)
class Spectrum:
    """One matrix to allocate: its shape and descending squared singular values (whitened)."""

    name: str
    in_features: int
    out_features: int
    energy: torch.Tensor  # (min(in, out),) float64, descending

    @property
    def block_params(self) -> int:
        """Parameters one rank adds: a column of V and a row of U."""
        return self.in_features + self.out_features

    def max_rank(self, align: int) -> int:
        """The largest aligned rank below full rank (full rank never saves parameters)."""
        return (min(self.in_features, self.out_features) - 1) // align * align

    def relative_error(self, rank: int) -> float:
        """Relative activation-weighted error ``sqrt(Σ_{i≥r} σ_i² / Σ σ_i²)`` at ``rank``."""
        total = float(self.energy.sum())
        return (float(self.energy[rank:].sum()) / total) ** 0.5 if total > 0 else 0.0


def uniform_ranks(spectra: list[Spectrum], keep: float, align: int) -> dict[str, int]:
    """Every matrix at the rank rule's rank for ``keep`` (the paper's and the foundation's choice)."""
    return {s.name: rank_for_keep(s.in_features, s.out_features, keep, align) for s in spectra}


def budget(spectra: list[Spectrum], keep: float) -> int:
    """Parameters allowed for all the matrices together at ``keep``."""
    return round(keep * sum(s.in_features * s.out_features for s in spectra))


def allocate_ranks(spectra: list[Spectrum], keep: float, align: int) -> dict[str, int]:
    """Ranks minimising the summed relative squared errors within the budget of ``keep``.

    Every matrix starts at one block of ``align``; blocks then go, one at a time, to the matrix
    whose next block removes the most relative error per parameter, while the budget allows. The
    error curves are convex (σ descending), so with equal block costs (matrices of one MLP shape
    have ``in + out`` in common) this greedy choice is optimal; with unequal costs it can miss the
    optimum only by how the last blocks pack. The parameters left over are fewer than the cheapest
    block that did not fit.

    Raises:
        ValueError: keep outside (0, 1], align < 1, or a budget below one block per matrix.
    """
    if not spectra:
        raise ValueError("no matrices to allocate ranks to")
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    if align < 1:
        raise ValueError(f"align must be >= 1, got {align}")
    for s in spectra:
        if s.max_rank(align) < align:
            raise ValueError(f"align {align} leaves no room for a rank below min(in, out) for {s.name}")
    ranks = {s.name: align for s in spectra}
    left = budget(spectra, keep) - sum(align * s.block_params for s in spectra)
    if left < 0:
        raise ValueError(
            f"keep {keep} is below one block of {align} ranks per matrix; lower align or raise keep"
        )
    totals = {s.name: float(s.energy.sum()) or 1.0 for s in spectra}

    def gain(s: Spectrum, rank: int) -> float:  # relative squared error removed per parameter
        return float(s.energy[rank : rank + align].sum()) / totals[s.name] / (align * s.block_params)

    heap = [(-gain(s, align), i) for i, s in enumerate(spectra) if s.max_rank(align) > align]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        s = spectra[i]
        cost = align * s.block_params
        if cost > left:
            continue  # this matrix's next block no longer fits; cheaper ones may
        ranks[s.name] += align
        left -= cost
        if ranks[s.name] < s.max_rank(align):
            heapq.heappush(heap, (-gain(s, ranks[s.name]), i))
    return ranks
