"""Factorise one decoder layer's MLP at given ranks and swap the low-rank module in.

Whitened by each projection's calibration Gram when the layer has one, plain SVD otherwise. With the
MLP's calibration inputs (closed-form healing), down is fitted last so that it compensates the error
of the compressed gate and up (see :mod:`svdmlp.compression.heal.closed_form`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from svdmlp import arch, lowrank, ranks
from svdmlp.compression.calibration import LayerGrams
from svdmlp.compression.heal import closed_form
from svdmlp.compression.report import LayerRecord, ProjectionRecord
from svdmlp.decompose import Decomposition, Factors, weighted_relative_error


def decomposition(weight: torch.Tensor, grams: LayerGrams | None, name: str) -> Decomposition:
    """Weighted by projection ``name``'s calibration statistics when the layer has them (see
    :meth:`LayerGrams.decomposition`), plain otherwise."""
    return Decomposition.of(weight) if grams is None else grams.decomposition(weight, name)


def _projection(weight: torch.Tensor, factors: Factors | None = None):
    """``x -> x·Wᵀ`` (or ``x·Uᵀ·Vᵀ`` with factors) in float32, for :func:`closed_form.down_grams`."""
    if factors is None:
        w_t = weight.detach().float().T
        return lambda x: x @ w_t
    u_t, v_t = factors.u.float().T, factors.v.float().T
    return lambda x: (x @ u_t) @ v_t


def _down_grams(model, spec, index, factors, inputs, dense_gram) -> closed_form.DownGrams:
    """Statistics of down's inputs with the dense and with the (already factorised) gate and up."""
    weights = {name: arch.dense_projection(model, spec, index, name).weight for name in arch.PROJECTIONS}
    dense = tuple(_projection(weights[name]) for name in ("gate", "up"))
    compressed = tuple(_projection(weights[name], factors.get(name)) for name in ("gate", "up"))
    return closed_form.down_grams(inputs, dense, compressed, spec.activation, dense_gram, weights["down"])


def layer(
    model: nn.Module,
    spec: arch.ArchSpec,
    index: int,
    ranks_by_name: dict[str, int],
    grams: LayerGrams | None,
    inputs: list[torch.Tensor] | None = None,
) -> LayerRecord:
    """Factorise layer ``index``'s projections at ``ranks_by_name``, swap them in, and record it.

    Args:
        grams: the layer's calibration Grams (None: plain SVD, errors in weight space).
        inputs: the MLP's calibration input batches: down is then fitted to compensate gate and up.
    """
    factors, records = {}, []
    for name, rank in ranks_by_name.items():
        linear = arch.dense_projection(model, spec, index, name)
        weight = linear.weight
        factors[name] = decomposition(weight, grams, name).factors(rank)
        gram = None if grams is None else grams.input_gram(name)
        healed = None
        if inputs is not None and name == "down":
            down_grams = _down_grams(model, spec, index, factors, inputs, gram)

            def reload(factors=factors, gram=gram):
                return _down_grams(model, spec, index, factors, inputs, gram).compressed

            healed = closed_form.compensating_down(weight, down_grams, rank, factors[name], reload)
            del down_grams
            factors[name] = healed.factors
        records.append(
            ProjectionRecord(
                name,
                linear.in_features,
                linear.out_features,
                rank,
                ranks.achieved_keep([(linear.in_features, linear.out_features, rank)]),
                weighted_relative_error(weight, factors[name], gram),
                heal_error_before=None if healed is None else healed.before,
                heal_error_after=None if healed is None else healed.after,
            )
        )
    dense = arch.dense_projection(model, spec, index, next(iter(ranks_by_name)))
    lowrank.install(model, spec, index, ranks_by_name, dense.weight.dtype, dense.weight.device, factors)
    return LayerRecord(index, arch.mlp_name(spec, index), "compressed", projections=tuple(records))
