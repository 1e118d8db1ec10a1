"""The ranks of quantization's low-rank corrections, allocated per layer from measured divergence.

A uniform correction (the rank rule at ``correction_keep`` for every weight) spends as much on a layer
whose rounding the model hardly notices as on one where it matters. As for compression's ``--allocate``
(:mod:`svdmlp.compression.sensitivity`), what matters is measured, not guessed from spectra:

1. each layer of the dense model, one at a time, on the calibration windows: its MLP weights rounded by
   GPTQ on their input Grams, and the whitened spectrum of each rounding error (a rank-``r``
   correction takes out its ``r`` largest squared singular values, :mod:`svdmlp.compression.correction`);
2. the divergence of the model with that layer alone rounded (KL from the dense model's next-token
   distribution on the probe windows, nats/token);
3. one rank per layer (its three weights alike, as compression's allocation does; 0 where a layer does
   best without) within the budget of ``correction_keep``, each layer's divergence extrapolated to a
   rank by the share of its rounding error's energy the rank leaves
   (:func:`svdmlp.ranks.allocate_layer_ranks`, rank 0 the reference).

The walk that then stores the weights rounds them again, each layer on the outputs of the layers already
rounded; the ranks chosen here on the dense walk are kept.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from svdmlp import arch, lazy, ranks
from svdmlp.compression import sensitivity, sequential
from svdmlp.compression.calibration import config_windows, tokens_hash
from svdmlp.config import CompressConfig
from svdmlp.decompose import Decomposition
from svdmlp.int_weights import Scheme, dequantize, gptq


@torch.no_grad()
def allocate(
    model: nn.Module,
    tokenizer,
    how: Scheme,
    config: CompressConfig,
    keep: float,
    windows: torch.Tensor,
    progress: bool = True,
) -> tuple[dict[int, int], dict]:
    """One correction rank per decoder layer of the dense ``model`` (its MLP weights rounded by ``how``)
    within the budget of corrections keeping ``keep``, aligned to ``config.align``, measured on the
    calibration ``windows`` (probes drawn from ``config``'s calibration); and what the report records of
    it (the probes, each layer's divergence and rank)."""
    started = time.perf_counter()
    spec = arch.of_model(model)
    bos = arch.bos_token_id(spec, tokenizer)
    count, seq_len = sensitivity.probe_shape(len(config.calibration.mixture), config.calibration.seq_len)
    probes = config_windows(tokenizer, config, None, count, seq_len, config.seed + 3, bos)
    probe = sensitivity.Probe(model, spec, probes)
    layers = arch.decoder_layers(model, spec)
    measured = []
    walk = sequential.calibrated_layers(
        model, spec, windows, list(range(len(layers))), progress=progress, dense=True
    )
    for index, grams, _ in walk:
        spectra, rounded = [], {}
        with lazy.held(model, layers[index]):
            for name in arch.PROJECTIONS:
                weight = arch.dense_projection(model, spec, index, name).weight.float()
                q, scales = gptq(weight, grams.input_gram(name), how)
                rounded[name] = dequantize(q, scales, tuple(weight.shape))
                error = Decomposition.of(weight - rounded[name], grams.whitening(name))
                n_out, n_in = weight.shape
                spectra.append(ranks.Spectrum(f"{index}.{name}", n_in, n_out, error.energy))
            del grams  # before the walk makes the next layer's
            kl = probe.divergence_of(index, {name: (lambda w=w: w) for name, w in rounded.items()})
        measured.append(ranks.LayerSensitivity(index, tuple(spectra), kl, 0))
    chosen = ranks.allocate_layer_ranks(measured, keep, config.align, start=0)
    # None is the allocation's "left dense": for a correction, the largest rank that saves parameters
    allocated = {
        layer.index: layer.max_rank(config.align) if chosen[layer.index] is None else chosen[layer.index]
        for layer in measured
    }
    info = {
        "method": "measured-sensitivity",
        "tokens": probes.numel(),
        "sha256": tokens_hash(probes),
        "seconds": time.perf_counter() - started,
        "layers": [
            {
                "index": layer.index,
                "kl": layer.kl,
                "reference_rank": 0,  # rounded, no correction
                "rank": allocated[layer.index],
                "predicted_kl": layer.predicted_kl(allocated[layer.index]),
            }
            for layer in measured
        ],
    }
    return allocated, info
