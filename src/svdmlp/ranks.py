"""Everything about ranks: the keep→rank rule, the keep a set of ranks achieves, and the allocation of
ranks to layers from measured sensitivity under one parameter budget.

Pure math on ints, spectra and measured divergences: no modules, hooks or files, and no torch import
(the tile planner and the command line use the rule too).

Conventions: a projection ``W (out, in)`` is approximated by ``V (out, r) @ U (r, in)``. ``keep`` is the
fraction of the matrix's parameters kept, ``r·(in+out) / (in·out)``; the NeuronMLP paper's
"compression ratio" is ``1 − keep``.

A matrix's *spectrum* here
is the squared singular values ``σ²`` of its whitened form ``W·S`` (``S`` the root of the calibration
Gram), so that the activation-weighted truncation error of rank ``r`` is ``Σ_{i≥r} σ_i²`` and its
relative value is that over ``Σ σ_i²``: exactly the error :func:`svdmlp.decompose.whitened_svd`
leaves.

Why layers, and why measured: spectra alone say how much of each matrix's output a rank keeps, not
how much that output matters to the model's predictions. Allocating per matrix from spectra alone
(the summed relative errors) made SmolLM2 worse than uniform ranks (held-out PPL 99.7 against 85.5 at
equal parameters), as did weighting the errors by the loss gradients' second moment (124; see
BENCHMARKS.md). What the model's predictions lose is measured instead, once per layer
(:mod:`svdmlp.compression.sensitivity`), and the spectra only extrapolate it to other ranks. The gate, up and
down matrices of a GLU MLP share one rank: they cost the same per rank (``hidden + intermediate``),
and splitting the rank among them from spectra starved down projections whose calibration energy one
outlier direction dominates.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def check_keep(keep: float) -> float:
    """``keep`` itself if it is a number in (0, 1]; TypeError or ValueError naming it otherwise."""
    if isinstance(keep, bool) or not isinstance(keep, (int, float)):
        raise TypeError(f"keep must be a number, got {type(keep).__name__}")
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1] (fraction of parameters kept), got {keep}")
    return keep


def rank_for_keep(in_features: int, out_features: int, keep: float, align: int) -> int:
    """Block-aligned rank that keeps about ``keep`` of an ``out × in`` matrix's parameters: the rank rule.

    ``r = max(align, round(keep·in·out / ((in+out)·align))·align)``, capped below
    ``min(in, out)`` (kept a multiple of ``align`` where possible).

    Raises:
        ValueError: for keep outside (0, 1], align < 1, or a matrix too small for one block.
    """
    check_keep(keep)
    if align < 1:
        raise ValueError(f"align must be >= 1, got {align}")
    full = min(in_features, out_features)
    if align >= full:
        raise ValueError(
            f"align {align} leaves no room for a rank below min(in, out) = {full} "
            f"for a {out_features}x{in_features} matrix; use a smaller align"
        )
    blocks = round(keep * in_features * out_features / ((in_features + out_features) * align))
    rank = max(align, blocks * align)
    if rank >= full:
        rank = (full - 1) // align * align
    return rank


def uniform_ranks(shapes: Mapping[str, tuple[int, int]], keep: float, align: int) -> dict[str, int]:
    """The rank rule applied to each named ``(in_features, out_features)`` matrix; a ValueError for a
    keep under half of what one block of ``align`` ranks keeps of one of them (the rule would keep far
    more than asked: keep 1e-9 once gave 0.076 on SmolLM2-135M)."""
    planned = {name: rank_for_keep(n_in, n_out, keep, align) for name, (n_in, n_out) in shapes.items()}
    for name, (n_in, n_out) in shapes.items():
        least = align * (n_in + n_out) / (n_in * n_out)
        if keep < least / 2:
            raise ValueError(
                f"keep {keep:g} is far below what one block of {align} ranks keeps of a {n_out}x{n_in} "
                f"{name} projection ({least:.3f}): ask for a larger keep or a smaller --align"
            )
    return planned


def achieved_keep(matrices: Iterable[tuple[int, int, int | None]]) -> float:
    """Kept fraction of the parameters of ``(in_features, out_features, rank)`` matrices together;
    a rank of None is a matrix left dense. For one matrix: ``r·(in+out) / (in·out)``."""
    kept = total = 0
    for n_in, n_out, rank in matrices:
        total += n_in * n_out
        kept += n_in * n_out if rank is None else rank * (n_in + n_out)
    if total == 0:
        raise ValueError("achieved keep of no matrices")
    return kept / total


@dataclass(frozen=True)
class Spectrum:
    """One matrix: its shape and descending squared singular values (whitened)."""

    name: str
    in_features: int
    out_features: int
    energy: torch.Tensor  # (min(in, out),) float64, descending

    @property
    def block_params(self) -> int:
        """Parameters one rank adds: a column of V and a row of U."""
        return self.in_features + self.out_features

    @property
    def dense_params(self) -> int:
        return self.in_features * self.out_features

    def max_rank(self, align: int) -> int:
        """The largest aligned rank whose factors store fewer parameters than the dense matrix,
        ``r·(in + out) < in·out``: a higher rank is bigger than the matrix and still inexact."""
        return (self.dense_params - 1) // self.block_params // align * align

    def relative_error(self, rank: int) -> float:
        """Relative activation-weighted error ``sqrt(Σ_{i≥r} σ_i² / Σ σ_i²)`` at ``rank``."""
        total = float(self.energy.sum())
        return (float(self.energy[rank:].sum()) / total) ** 0.5 if total > 0 else 0.0


@dataclass(frozen=True)
class LayerSensitivity:
    """One decoder layer's MLP: its matrices and the divergence measured with all of them at one rank.

    ``kl`` is what factorising this layer alone, every matrix at ``reference_rank``, did to the model's
    next-token distribution (nats/token, see :mod:`svdmlp.compression.sensitivity`). At another rank the layer's
    divergence is predicted to scale with its summed relative squared error.
    """

    index: int
    spectra: tuple[Spectrum, ...]
    kl: float
    reference_rank: int

    def error(self, rank: int) -> float:
        return sum(s.relative_error(rank) ** 2 for s in self.spectra)

    def predicted_kl(self, rank: int | None) -> float:
        """At ``rank``, or 0 for the layer left dense (``None``)."""
        reference = self.error(self.reference_rank)
        if rank is None or reference <= 0:
            return 0.0
        return self.kl * self.error(rank) / reference

    def params(self, rank: int | None) -> int:
        """Parameters of the layer's matrices at ``rank``, or dense (``None``)."""
        if rank is None:
            return sum(s.dense_params for s in self.spectra)
        return rank * sum(s.block_params for s in self.spectra)

    def max_rank(self, align: int) -> int:
        return min(s.max_rank(align) for s in self.spectra)


def budget(layers: list[LayerSensitivity], keep: float) -> int:
    """Parameters allowed for all the layers' matrices together at ``keep``."""
    return round(keep * sum(s.in_features * s.out_features for layer in layers for s in layer.spectra))


def allocate_layer_ranks(
    layers: list[LayerSensitivity], keep: float, align: int, start: int | None = None
) -> dict[int, int | None]:
    """One rank per layer (None: left dense) minimising the summed predicted divergence within the
    budget of ``keep``.

    Every layer starts at ``start`` (default one block of ``align``; 0 for a correction, which a layer
    may do without); steps then go, one at a time, to the layer whose
    next step removes the most predicted divergence per parameter, while the budget allows. A step is
    one more block, up to the largest rank that is still smaller than the dense matrices; past it, the
    last step leaves the layer dense (exact, and cheaper than one more block). The predicted
    divergence is convex in the rank (σ descending), so with equal block costs (the layers of one
    model share their MLP shape) the greedy choice among blocks is optimal; the dense step and unequal
    costs can make it miss the optimum by how the last steps pack. The parameters left over are fewer
    than the cheapest step that did not fit.

    Raises:
        ValueError: no layers, keep outside (0, 1], align < 1, or a budget below one block per layer.
    """
    if not layers:
        raise ValueError("no layers to allocate ranks to")
    check_keep(keep)
    if align < 1:
        raise ValueError(f"align must be >= 1, got {align}")
    for layer in layers:
        if layer.max_rank(align) < align:
            raise ValueError(
                f"align {align} leaves no room for a rank that saves parameters in layer {layer.index}"
            )
    start = align if start is None else start
    ranks: dict[int, int | None] = {layer.index: start for layer in layers}
    left = budget(layers, keep) - sum(layer.params(start) for layer in layers)
    if left < 0:
        raise ValueError(
            f"keep {keep} is below one block of {align} ranks per matrix; lower align or raise keep"
        )

    def step(layer: LayerSensitivity) -> tuple[int | None, int, float] | None:
        """(rank after the layer's next step, its parameters, divergence removed per parameter)."""
        rank = ranks[layer.index]
        if rank is None:
            return None
        after = rank + align if rank < layer.max_rank(align) else None
        cost = layer.params(after) - layer.params(rank)
        return after, cost, (layer.predicted_kl(rank) - layer.predicted_kl(after)) / cost

    heap = [(-step(layer)[2], n) for n, layer in enumerate(layers)]
    heapq.heapify(heap)
    while heap:
        _, n = heapq.heappop(heap)
        layer = layers[n]
        after, cost, _ = step(layer)
        if cost > left:
            continue  # this layer's next step no longer fits; cheaper ones may
        ranks[layer.index] = after
        left -= cost
        following = step(layer)
        if following is not None:
            heapq.heappush(heap, (-following[2], n))
    return ranks
