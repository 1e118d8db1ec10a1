"""A dense model's MLP weights rounded by GPTQ on calibration windows, in place, for evaluation: the
calibrated baseline that compression is compared with (:mod:`svdmlp.quantize` rounds to nearest).

Fake quantization, as there: each weight is replaced by the value its integers stand for, which is what
an int8/int4 kernel would multiply by; the bytes counted are the packed ones. Layers go one at a time,
each on the hidden states of the layers before it as already rounded (:func:`sequential.calibrated_layers`):
gate and up with the Gram of the MLP's input, down with the Gram of its own input. A model on disk has
each layer written back once rounded.
"""

from __future__ import annotations

import torch
from torch import nn

from svdmlp import arch, lazy
from svdmlp.compression import sequential
from svdmlp.compression.calibration import config_windows, tokens_hash
from svdmlp.compression.correction import CORRECTION_ROUNDS, corrected
from svdmlp.config import CompressConfig
from svdmlp.int_weights import FakeQuantization, gptq, scheme
from svdmlp.ranks import rank_for_keep


@torch.no_grad()
def quantize_dense_mlps(
    model: nn.Module,
    tokenizer,
    name: str,
    config: CompressConfig | None = None,
    progress: bool = True,
    correction_keep: float = 0.0,
    rounds: int = CORRECTION_ROUNDS,
) -> dict:
    """Round every MLP weight of the dense ``model`` by GPTQ (scheme ``name``) on the calibration windows
    ``config`` names (default: what ``svdmlp compress`` draws with no flag); what it cost, as
    :func:`svdmlp.quantize.quantize_mlp` reports it, and the calibration tokens used (count, SHA-256).

    With ``correction_keep`` > 0, each weight keeps a low-rank correction of its rounding error
    (:mod:`svdmlp.compression.correction`) of the rank that keeps that fraction of its parameters (the
    rank rule of ``--keep``, aligned to ``config.align``), counted in bf16 in the MLP's bytes; quantization
    and correction solved in turn ``rounds`` times."""
    how = scheme(name)
    config = config or CompressConfig()
    spec = arch.of_model(model)
    windows = config_windows(tokenizer, config, None, bos=arch.bos_token_id(spec, tokenizer))
    layers = arch.decoder_layers(model, spec)
    tally = FakeQuantization(how)
    walk = sequential.calibrated_layers(model, spec, windows, list(range(len(layers))), progress=progress)
    for index, grams, _ in walk:
        mlp = getattr(layers[index], spec.mlp)
        for projection in arch.PROJECTIONS:
            weight = getattr(mlp, spec.projection(projection)).weight
            gram = grams.input_gram(projection)
            if not correction_keep:
                tally.replace(weight, *gptq(weight.float(), gram, how))
                continue
            rank = rank_for_keep(weight.shape[1], weight.shape[0], correction_keep, config.align)
            fixed = corrected(weight, gram, grams.whitening(projection), how, rank, rounds)
            tally.replace(weight, fixed.q, fixed.scales, (fixed.correction.v, fixed.correction.u))
        lazy.store(model, layers[index])  # held by the walk, which runs it on as rounded
        del grams  # before the walk makes the next layer's
    digest = {"calibration_tokens": windows.numel(), "calibration_sha256": tokens_hash(windows)}
    correction = {"correction_keep": correction_keep, "correction_rounds": rounds} if correction_keep else {}
    return {**tally.report(), "method": "gptq", **correction, **digest}
