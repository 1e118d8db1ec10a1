"""Measured sensitivity, and the ranks allocated from it (``--allocate``).

What factorising one layer's MLP alone does to the model's predictions:

For each layer, its MLP projections are replaced in place by their low-rank reconstructions ``V·U``
(same shape, so nothing else changes), the model scores a few calibration windows, and the weights
are put back, also when the forward fails. The divergence is the KL from the dense model's
next-token distribution, ``Σ p·(log p − log q)`` averaged over tokens, in nats per token.

The layers before the probed one compute exactly what they computed in the dense pass, so they
replay their recorded outputs instead (about 40% of SmolLM2's probe forward passes on average).

:func:`measure` probes every layer at the rank rule's rank (of one keep, or of each of a sweep's keeps
at once); :func:`allocate` extrapolates each layer's divergence to other ranks with its whitened spectra,
and lets :func:`svdmlp.ranks.allocate_layer_ranks` share the parameter budget out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from svdmlp import arch, lazy, ranks
from svdmlp.compression import factorise
from svdmlp.compression.calibration import LayerGrams, tokens_hash
from svdmlp.compression.layer_inputs import head_only, logits_by_rows, stood_in
from svdmlp.decompose import Factors

# Tokens scored per layer and candidate rank to measure its sensitivity (--allocate): the 512 that the
# allocation was validated with on SmolLM2 (BENCHMARKS.md), in windows of at most 256 tokens and at
# least one per calibration source (a mixture of five: 5 windows of 102 tokens), never under 64 tokens.
SENSITIVITY_TOKENS = 512
SENSITIVITY_SEQ_LEN = 256
SENSITIVITY_MIN_SEQ_LEN = 64


def probe_shape(sources: int, calibration_seq_len: int) -> tuple[int, int]:
    """(windows, tokens each) of the sensitivity probes for a mixture of ``sources`` texts."""
    count = max(sources, SENSITIVITY_TOKENS // SENSITIVITY_SEQ_LEN)
    seq_len = max(SENSITIVITY_MIN_SEQ_LEN, min(SENSITIVITY_SEQ_LEN, SENSITIVITY_TOKENS // count))
    return count, min(seq_len, calibration_seq_len)


@contextmanager
def _replaced(
    model: nn.Module, spec: arch.ArchSpec, index: int, weights: dict[str, Callable[[], torch.Tensor]]
) -> Iterator:
    """Layer ``index``'s projections hold what ``weights`` make (each made when its projection is
    replaced) inside the block, and their own weights after it."""
    originals = {}
    try:
        for name, make in weights.items():
            weight = arch.dense_projection(model, spec, index, name).weight
            originals[name] = weight.data
            weight.data = make().to(weight.device, weight.dtype)
        yield
    finally:
        for name, data in originals.items():
            arch.dense_projection(model, spec, index, name).weight.data = data


def _products(factors: dict[str, Factors]) -> dict[str, Callable[[], torch.Tensor]]:
    """Each projection's ``V·U`` in float32, made when asked for."""
    return {name: (lambda pair=pair: pair.v.float() @ pair.u.float()) for name, pair in factors.items()}


def log_prob_blocks(model: nn.Module, spec: arch.ArchSpec, windows: torch.Tensor) -> Iterator[torch.Tensor]:
    """Next-token log-probabilities of all ``windows``, ``(rows, vocab)`` a few rows at a time, always in
    the same order: one forward pass through the decoder layers (a model on disk loads each layer once
    per pass), then the model's own head on a few positions at a time
    (:func:`~svdmlp.compression.layer_inputs.logits_by_rows`), so that the logits of all tokens are
    never whole in memory."""
    layers = arch.decoder_layers(model, spec)
    ids = windows.to(next(model.parameters()).device)
    with _recorded([layers[-1]]) as last:
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
    hidden = last[0][0] if isinstance(last[0], tuple) else last[0]
    with head_only(model, spec, hidden), lazy.held(model, model.get_output_embeddings()):
        for _, logits in logits_by_rows(model, hidden):
            rows = logits.float().reshape(-1, logits.shape[-1])
            del logits
            block = rows - torch.logsumexp(rows, dim=-1, keepdim=True)
            del rows
            yield block
            del block  # a generator holds its locals while the caller works: none is kept for the next block


@contextmanager
def _recorded(layers: list[nn.Module]) -> Iterator[list]:
    """Inside the block, each decoder layer's output of the (last) forward pass is kept."""
    outputs = [None] * len(layers)

    def keep(index):
        return lambda module, args, output: outputs.__setitem__(index, output)

    handles = [layer.register_forward_hook(keep(index)) for index, layer in enumerate(layers)]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


class _Replay(nn.Module):
    """Stands in for a decoder layer before the probed one: returns its recorded output, computes
    nothing (and, not being the layer, loads nothing of a model on disk)."""

    def __init__(self, output):
        super().__init__()
        self.output = output

    def forward(self, *args, **kwargs):
        return self.output


def summed_kl(dense: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``Σ p·(log p − log q)`` over the rows of two ``(rows, vocab)`` log-probabilities, ``dense``
    (``log p``) and ``other`` (``log q``): the one formula of KL here, for the probes and for
    distillation's loss (differentiable)."""
    return F.kl_div(other, dense, log_target=True, reduction="sum")


def block_kl(dense: Iterable[torch.Tensor], blocks: Iterable[torch.Tensor]) -> float:
    """Summed over rows, ``KL(p ‖ q)`` of aligned blocks of log-probabilities (:func:`log_prob_blocks`
    of the dense model and of another, in the same order)."""
    total, student = 0.0, iter(blocks)
    for p in dense:  # not zip, whose reused result tuple would hold each block until the next is made
        q = next(student, None)
        if q is None:
            raise ValueError("fewer blocks than the dense model's")
        total += float(summed_kl(p, q))
        del q
    if next(student, None) is not None:
        raise ValueError("more blocks than the dense model's")
    return total


class Probe:
    """The dense model's predictions on some windows, and each layer's outputs on the way, recorded
    once; :meth:`divergence` then measures one layer's factorisation against them."""

    @torch.no_grad()
    def __init__(self, model: nn.Module, spec: arch.ArchSpec, windows: torch.Tensor):
        self.model, self.spec, self.windows = model, spec, windows
        self.layers = arch.decoder_layers(model, spec)
        with _recorded(list(self.layers)) as outputs:
            blocks = list(log_prob_blocks(model, spec, windows))
        self.dense = blocks  # (rows, vocab) blocks in the order divergence's pass makes them
        self.outputs = outputs

    @torch.no_grad()
    def divergence(self, index: int, factors: dict[str, Factors]) -> float:
        """KL (nats/token) from the dense model to the model with only layer ``index``'s projections
        replaced by ``factors``; the model is dense again afterwards."""
        return self.divergence_of(index, _products(factors))

    @torch.no_grad()
    def divergence_of(self, index: int, weights: dict[str, Callable[[], torch.Tensor]]) -> float:
        """The same for any stand-in weights (a quantized layer's values), each made when used."""
        with (
            _replaced(self.model, self.spec, index, weights),
            stood_in(self.layers, {i: _Replay(self.outputs[i]) for i in range(index)}),
        ):
            kl = block_kl(self.dense, log_prob_blocks(self.model, self.spec, self.windows))
        return kl / self.windows.numel()


def measure(
    model: nn.Module,
    spec: arch.ArchSpec,
    references: list[dict[int, dict[str, int]]],
    grams: Iterable[tuple[int, LayerGrams | None]],
    windows: torch.Tensor,
) -> Iterator[list[ranks.LayerSensitivity]]:
    """Each layer's sensitivity at the ranks of each of ``references``, one list (in their order) per
    layer that ``grams`` yields.

    Several references (a sweep's keeps) share all but their probes: the layer's Grams, the whitened
    decompositions that give its spectra, and the dense model's predictions. Each reference adds its
    factors (float32, cut from the same decomposition) and one probe.

    Args:
        references: the ranks of each layer's projections to probe at (the rank rule's, at a keep).
        grams: ``(index, Grams)`` of the layers to measure in order, the dense model's (None: the layer
            is probed with plain SVD); an iterator, so that the Grams can be made one layer at a time
            (:func:`svdmlp.compression.sequential.calibrated_layers` on the dense model) and dropped
            after the probe. Whitenings computed here stay with Grams the caller keeps.
        windows: the tokens the probes score.
    """
    probe = None
    decoder_layers = arch.decoder_layers(model, spec)
    for index, layer_grams in grams:
        probe = probe or Probe(model, spec, windows)
        factors = [{} for _ in references]
        spectra = []
        with lazy.held(model, decoder_layers[index]):
            for name in references[0][index]:
                linear = arch.dense_projection(model, spec, index, name)
                decomposition = factorise.decomposition(linear.weight, layer_grams, name)
                for chosen, reference in zip(factors, references, strict=True):
                    chosen[name] = decomposition.factors(reference[index][name])
                spectra.append(
                    ranks.Spectrum(
                        f"{index}.{name}", linear.in_features, linear.out_features, decomposition.energy
                    )
                )
                del decomposition  # its bases (inter² float64 each) before the next projection's
            del layer_grams  # before ``grams`` makes the next layer's
            divergences = [probe.divergence(index, chosen) for chosen in factors]
        del factors
        # A GLU MLP's matrices all cost hidden + intermediate per rank: the layer's first rank stands for all.
        yield [
            ranks.LayerSensitivity(index, tuple(spectra), divergence, next(iter(reference[index].values())))
            for divergence, reference in zip(divergences, references, strict=True)
        ]


def allocate(
    reference: dict[int, dict[str, int]],
    measured: dict[int, ranks.LayerSensitivity],
    windows: torch.Tensor,
    keep: float,
    align: int,
    seconds: float,
) -> tuple[dict[int, dict[str, int]], dict]:
    """One rank per layer from its divergence measured at the rank rule's rank (:func:`measure`), within
    ``keep``'s budget.

    Args:
        reference: the rank rule's ranks of each layer's projections (the probes' ranks).
        measured: every one of those layers' sensitivity, by index.
        windows: the tokens the probes scored.
        seconds: the measurement's time, for the report.

    Returns:
        The ranks of every projection of each layer to factorise (a layer the allocation leaves
        dense is absent; its rank is None in the record), and what the report records of the probes
        and the choice.
    """
    layers = [measured[index] for index in sorted(reference)]
    allocated = ranks.allocate_layer_ranks(layers, keep, align)
    info = {
        "method": "measured-sensitivity",
        "reference_keep": keep,
        "tokens": windows.numel(),
        "sha256": tokens_hash(windows),
        "seconds": seconds,
        "layers": [
            {
                "index": layer.index,
                "kl": layer.kl,
                "reference_rank": layer.reference_rank,
                "rank": allocated[layer.index],
                "predicted_kl": layer.predicted_kl(allocated[layer.index]),
            }
            for layer in layers
        ],
    }
    chosen = {
        index: dict.fromkeys(planned, allocated[index])
        for index, planned in reference.items()
        if allocated[index] is not None
    }
    return chosen, info
