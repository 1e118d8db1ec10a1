"""What the steps of one compression share (:class:`Run`), and the windows they draw (:class:`Windows`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from svdmlp import arch, lazy, ranks, runtime
from svdmlp.compression.calibration import config_windows, source_weights
from svdmlp.compression.clock import StepClock
from svdmlp.compression.report import LayerRecord
from svdmlp.compression.sensitivity import probe_shape
from svdmlp.config import CompressConfig


class Windows:
    """The windows a compression draws, each set drawn once (the calibration windows serve several
    steps), always before any layer is factorised (``self`` windows are sampled by the dense model)."""

    def __init__(self, model, tokenizer, config: CompressConfig, calibration_text: str | None, bos):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.calibration_text, self.bos = calibration_text, bos
        self.drawn: dict[tuple, torch.Tensor] = {}

    def __call__(self, count: int | None = None, seq_len: int | None = None, seed: int | None = None):
        key = (count, seq_len, seed)
        if key not in self.drawn:
            self.drawn[key] = config_windows(
                self.tokenizer, self.config, self.calibration_text, count, seq_len, seed, self.bos, self.model
            )
        return self.drawn[key]

    def probes(self) -> torch.Tensor:
        """The windows the sensitivity probes score (:func:`probe_shape`)."""
        sources = len(source_weights(self.config, self.calibration_text))
        count, seq_len = probe_shape(sources, self.config.calibration.seq_len)
        return self(count, seq_len, self.config.seed + 3)


# A layer the allocation found worth its full rank (see ranks.allocate_layer_ranks): left dense.
LEFT_DENSE = "left dense by the allocation"


@dataclass
class Run:
    """One compression as its steps see it: what it compresses, and what each step leaves for the next."""

    model: nn.Module
    tokenizer: object
    config: CompressConfig
    calibration_text: str | None = None
    progress: bool = True
    resident_healing: bool = False
    clock: StepClock = field(default_factory=StepClock)
    on_step: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.spec = arch.of_model(self.model)
        self.layers = arch.decoder_layers(self.model, self.spec)
        self.mlp_names = [arch.mlp_name(self.spec, i) for i in range(len(self.layers))]
        self.selected = _check_layers(self.config, len(self.layers))
        self.skip = {i: _check_weights(self.model, self.spec, i, self.config) for i in self.selected}
        self.to_compress = [i for i in self.selected if not self.skip[i]]
        # The rank rule's ranks: an impossible rank fails here, before any expensive work.
        self.planned = rule_ranks(self.model, self.spec, self.config, self.to_compress)
        self.windows = Windows(
            self.model,
            self.tokenizer,
            self.config,
            self.calibration_text,
            arch.bos_token_id(self.spec, self.tokenizer),
        )
        self.grams: dict = {}  # dense input Grams by layer (one-shot factorising of a model in memory)
        self.outputs: dict = {}  # the dense model's output-gradient Grams by layer (fisher)
        self.calibration_info: dict = {}
        self.collected_here = True  # the output-gradient Grams are this run's: deleted once used
        self.allocation: dict = {}
        self.records: dict[int, LayerRecord] = {}  # each compressed layer's record, by index
        self.healing: dict = {}
        self.quantization: dict = {}

    @property
    def in_memory(self) -> bool:
        return lazy.of(self.model) is None

    def done(self, step: str) -> None:
        """Step ``step`` has ended: its activations go back to the system (a 1.5B model's 224 windows:
        0.7 GB of hidden states, as many MLP inputs, which glibc's heap otherwise keeps in part: 0.4 GB of
        a distillation's floor after a 224-window factorisation, BENCHMARKS.md session 22), and the caller
        hears of it."""
        runtime.trim_heap()
        if self.on_step is not None:
            self.on_step(step)

    def store(self, index: int | None) -> Path | None:
        """Write compressed layer ``index`` to disk and drop it from memory, when the model lives on disk;
        the file."""
        return lazy.store(self.model, self.layers[index]) if index is not None else None

    def discard_outputs(self, index: int) -> None:
        """Delete layer ``index``'s spilled output-gradient Grams once it is done with them, when they are
        this run's own."""
        grams = self.outputs.get(index)
        if self.collected_here and grams is not None:
            grams.discard()


def rule_ranks(model, spec, config, indices) -> dict[int, dict[str, int]]:
    """The rank rule's rank of every targeted projection of layers ``indices`` (a ValueError for an
    impossible one: :func:`~svdmlp.ranks.uniform_ranks`)."""
    planned = {}
    for index in indices:
        linears = {name: arch.dense_projection(model, spec, index, name) for name in config.targets}
        shapes = {name: (linear.in_features, linear.out_features) for name, linear in linears.items()}
        planned[index] = ranks.uniform_ranks(shapes, config.keep, config.align)
    return planned


def _check_layers(config: CompressConfig, num_layers: int) -> list[int]:
    if config.layers is None:
        return list(range(num_layers))
    bad = [i for i in config.layers if i >= num_layers]
    if bad:
        raise ValueError(f"layers {bad} do not exist: the model has {num_layers} decoder layers")
    return list(config.layers)


def _check_weights(model: nn.Module, spec: arch.ArchSpec, index: int, config: CompressConfig) -> str:
    """Reason to skip this layer's MLP, or "" to compress it; NaN/inf weights are an error."""
    with lazy.held(model, arch.decoder_layers(model, spec)[index]):
        reason = ""
        for name in config.targets:
            linear = arch.dense_projection(model, spec, index, name)
            if not isinstance(linear, nn.Linear):
                return f"{spec.projection(name)} is a {type(linear).__name__}, not a dense nn.Linear"
            if not runtime.all_finite(linear.weight):
                raise ValueError(
                    f"{arch.mlp_name(spec, index)}.{spec.projection(name)} has NaN or inf weights"
                )
            if linear.bias is not None:
                reason = f"{spec.projection(name)} has a bias (not supported by the low-rank modules)"
        return reason
