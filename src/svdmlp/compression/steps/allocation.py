"""Allocation (``--allocate``): one rank per layer from each layer's measured sensitivity (the KL it
alone causes at the rank rule's rank), within the parameter budget of the keep; a layer found worth
its full rank is left dense."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.nn as nn
from tqdm.auto import tqdm

from svdmlp import lazy, ranks
from svdmlp.compression import sensitivity, sequential
from svdmlp.compression.calibration import Calibration
from svdmlp.compression.sensitivity import SENSITIVITY_TOKENS
from svdmlp.compression.steps import sizes
from svdmlp.compression.steps.context import LEFT_DENSE, Run, Windows, rule_ranks
from svdmlp.compression.steps.sizes import F32, LOGIT_COPIES, Sizes
from svdmlp.config import CompressConfig
from svdmlp.ranks import LayerSensitivity

# Keeps whose sensitivities one pass measures at most (measure_shared): each adds its factors of the
# layer's projections to the memory of the pass (float32 at keep 0.9: 0.15 GB for Qwen2.5-Coder-1.5B,
# 0.64 GB for Llama-3.1-8B), so that a sweep's memory does not grow with its number of keeps.
MEASURED_KEEPS = 3


def needed(run: Run) -> bool:
    return run.config.allocation == "budget" and bool(run.to_compress)


def allocate(
    run: Run,
    measured: dict[int, LayerSensitivity],
    on_measured: Callable[[LayerSensitivity], None] | None = None,
) -> tuple[dict[int, dict[str, int]], dict]:
    """Measure the layers not in ``measured`` (each handed to ``on_measured`` as it is made), then
    allocate: (the ranks of the layers to compress, the allocation's report)."""
    started = time.perf_counter()
    measured = dict(measured)
    to_probe = sorted(set(run.planned) - set(measured))
    layers = _measure(
        run.model, run.spec, [run.planned], to_probe, run.grams, run.outputs, run.windows, run.progress
    )
    for (layer,) in layers:
        measured[layer.index] = layer
        if on_measured is not None:
            on_measured(layer)
    probes = run.windows.probes()
    seconds = time.perf_counter() - started
    return sensitivity.allocate(run.planned, measured, probes, run.config.keep, run.config.align, seconds)


def apply(run: Run, planned: dict[int, dict[str, int]], report: dict) -> None:
    """Compress the layers ``planned`` at their ranks; the others are left dense."""
    run.planned, run.allocation = planned, report
    if not report:
        return
    for index in [i for i in run.to_compress if i not in planned]:
        run.skip[index] = LEFT_DENSE
        run.grams.pop(index, None)
        run.discard_outputs(index)
    run.to_compress = [i for i in run.to_compress if i in planned]


def measure_shared(
    model: nn.Module,
    tokenizer,
    configs: list[CompressConfig],
    recorded: list[dict[int, LayerSensitivity]],
    on_measured: list[Callable[[LayerSensitivity], None]],
    calibration: Calibration | None = None,
    progress: bool = True,
) -> None:
    """Measure the sensitivity of every layer that budget allocation gives a rank, for several keeps at
    once, each keep's measurement handed to its ``on_measured`` (its journal); each compression then
    allocates from them.

    A sweep's keeps share the expensive part: each layer's dense Grams, its whitened decompositions
    and the dense model's predictions, made once instead of once per keep; each keep adds only its
    factors and its probe (BENCHMARKS.md, session 19). The measurements equal those each compression
    would make alone.

    Args:
        configs: the same plan at up to :data:`MEASURED_KEEPS` keeps (a budget allocation on a model
            on disk).
        recorded: what each keep has measured already (a layer measured for one is not measured for
            it again).
        calibration: the output-gradient Grams the compressions share, for the ``fisher`` method.
    """
    plans = [{k: v for k, v in c.to_dict().items() if k != "keep"} for c in configs]
    if any(plan != plans[0] for plan in plans) or configs[0].allocation != "budget":
        raise ValueError("sensitivities are shared by budget allocations of one plan at different keeps")
    if len(configs) > MEASURED_KEEPS:
        raise ValueError(
            f"at most {MEASURED_KEEPS} keeps' sensitivities are measured at once, got {len(configs)}"
        )
    config = configs[0]
    run = Run(model, tokenizer, config, progress=progress)
    references = [rule_ranks(model, run.spec, c, run.to_compress) for c in configs]
    to_probe = [i for i in run.to_compress if any(i not in done for done in recorded)]
    if config.needs_output_grams and (calibration is None or set(to_probe) - set(calibration.outputs)):
        raise ValueError(
            "method 'fisher' measures sensitivity with the output-gradient Grams: none were given"
        )
    outputs = calibration.outputs if calibration is not None else {}
    desc = f"sensitivity of keeps {', '.join(f'{c.keep:g}' for c in configs)}"
    for layers in _measure(model, run.spec, references, to_probe, {}, outputs, run.windows, progress, desc):
        for done, record, layer in zip(recorded, on_measured, layers, strict=True):
            if layer.index not in done:
                record(layer)


def _measure(
    model, spec, references, to_probe, grams, outputs, windows: Windows, progress, desc="sensitivity"
):
    """:func:`sensitivity.measure` of layers ``to_probe`` at each of ``references``' ranks, on the dense
    Grams in ``grams`` (one-shot calibration of a model in memory) or else made one layer at a time."""
    if not to_probe:
        return
    if grams or not windows.config.needs_calibration:
        dense = ((index, grams.get(index)) for index in to_probe)
    else:
        dense = _dense_layers(model, spec, windows(), to_probe, outputs)
    layers = sensitivity.measure(model, spec, references, dense, windows.probes())
    yield from tqdm(layers, total=len(to_probe), desc=desc, unit="layer", disable=not progress)


def _dense_layers(model, spec, tokens, indices, outputs):
    """``(index, Grams)`` of the dense model's layers ``indices``, made one layer at a time (the
    model is left dense between items, so each layer runs once), with their output-gradient Grams attached."""
    walk = sequential.calibrated_layers(model, spec, tokens, indices, progress=False, dense=True)
    for index, layer_grams, _ in walk:
        layer_grams.outputs = outputs.get(index)
        layer_grams.keep_whitenings = lazy.of(model) is None
        yield index, layer_grams
        del layer_grams  # before the walk makes the next layer's


def cost(s: Sizes, keeps_probed: tuple[float, ...] = (), measured: int = 0) -> tuple[float, float] | None:
    """(peak bytes, seconds) of the allocation probing each layer but the ``measured`` ones at each of
    ``keeps_probed`` (default: the config's keep); None without budget allocation."""
    config = s.config
    if config.allocation != "budget" or not config.needs_calibration:
        return None
    h, i, vocab, speed = s.h, s.i, s.shapes.vocab, s.speed
    # Kept from the first probe to the last: the dense log-probabilities, whole, and every layer's
    # recorded output. Beside them, a projection's decomposition and the factors of the layer's
    # projections before it at every keep; or a probe: the embeddings, then the head, one at a time,
    # the probed log-probabilities a few rows at a time, every keep's factors and their products V·U
    # standing in for the layer's weights (Llama-3.2-1B shape: 3.67 GB measured, 3.0 predicted
    # without these last three, BENCHMARKS.md session 14; Qwen2.5-Coder-1.5B's three keeps at once:
    # 4.84 GB measured, 4.81 predicted, session 21).
    probed = keeps_probed or (config.keep,)
    factors_probed = sum((h + i) * ranks.rank_for_keep(h, i, keep, config.align) for keep in probed)
    recorded = SENSITIVITY_TOKENS * vocab * F32 + s.shapes.layers * SENSITIVITY_TOKENS * h * F32
    probe = (
        vocab * h * F32
        + sizes.logit_block(SENSITIVITY_TOKENS, vocab) * LOGIT_COPIES
        + 3 * (factors_probed + h * i) * F32
    )
    memory = s.per_layer + recorded + max(s.decomposing + 2 * factors_probed * F32, probe)
    probing = 2 * s.shapes.params * SENSITIVITY_TOKENS / 2 / speed.f32
    probes = max(0, s.compressed - measured)
    # The dense walk runs from the first layer, also when a stopped run measured some already.
    seconds = (s.walk / speed.f32 if probes else 0.0) + probes * (s.factorise + len(probed) * probing)
    return memory, seconds
