"""Calibration: text to token windows (one text or a weighted mixture), and the activation Gram
matrices of every MLP projection that the dense model's forward passes produce.

Activation-aware SVD needs, for each projection, ``G = Σ xᵀx`` over its calibration inputs. Gate
and up read the same input (the MLP's input), so they share one Gram; down reads
``act(gate(x))·up(x)``. Forward hooks add each batch's ``XᵀX`` into float64 accumulators and never
keep the activations themselves.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from svdmlp import arch, corpora, decompose
from svdmlp.compression.gram import accumulate_gram
from svdmlp.compression.output_grams import OutputGrams, collect_output_grams
from svdmlp.compression.self_calibration import self_windows
from svdmlp.config import CompressConfig
from svdmlp.engine import Engine

# Windows the dense model samples at once for ``self`` calibration.
SELF_BATCH = 8
# The output-gradient Gram G of the ``fisher`` method is used as G + 0.1·mean(diag G)·I: chosen on
# validation windows of the calibration texts (0, 0.1, 1) on SmolLM2-135M; 0.1 and 0 differ by 2%
# in held-out perplexity ratio, both far from input whitening alone (BENCHMARKS.md).
FISHER_DAMPING = 0.1
# The input Gram G of every whitened factorisation is used as G + INPUT_DAMPING·mean(diag G)·I: with
# none, a direction the calibration text never excited weighs nothing and its error is unbounded, which
# text unlike the calibration then pays for (issue 53; BENCHMARKS.md).
INPUT_DAMPING = 0.0


def token_windows(tokenizer, text: str, num_samples: int, seq_len: int, seed: int) -> torch.Tensor:
    """``num_samples`` windows of ``seq_len`` tokens drawn from ``text`` with a seeded generator.

    Windows start at random offsets; they are disjoint whenever the text holds enough tokens.

    Returns:
        LongTensor (num_samples, seq_len).
    """
    if not text.strip():
        raise ValueError("calibration text is empty")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if ids.numel() < seq_len:
        raise ValueError(f"calibration text has {ids.numel()} tokens; one window needs seq_len = {seq_len}")
    generator = torch.Generator().manual_seed(seed)
    slots = ids.numel() // seq_len
    if slots >= num_samples:  # disjoint windows: pick distinct slots, jitter within the slack
        chosen = torch.randperm(slots, generator=generator)[:num_samples].sort().values
        slack = ids.numel() - slots * seq_len
        starts = chosen * seq_len + torch.randint(0, slack + 1, (1,), generator=generator)
    else:
        starts = torch.randint(0, ids.numel() - seq_len + 1, (num_samples,), generator=generator)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def window_shares(weights: list[float], num_samples: int) -> list[int]:
    """Split ``num_samples`` windows by ``weights``: one each at least, the rest by largest remainder."""
    if num_samples < len(weights):
        raise ValueError(f"{num_samples} windows cannot cover {len(weights)} texts (one each at least)")
    total = sum(weights)
    spare = num_samples - len(weights)
    exact = [spare * w / total for w in weights]
    shares = [int(e) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in by_remainder[: spare - sum(shares)]:
        shares[i] += 1
    return [share + 1 for share in shares]


def mixture_windows(
    tokenizer, texts: list[tuple[str, float]], num_samples: int, seq_len: int, seed: int
) -> torch.Tensor:
    """Windows from several ``(text, weight)`` sources, each with its weight's share of ``num_samples``.

    Returns:
        LongTensor (num_samples, seq_len), the sources' windows in the order given.
    """
    shares = window_shares([weight for _, weight in texts], num_samples)
    return torch.cat(
        [
            token_windows(tokenizer, text, share, seq_len, seed)
            for (text, _), share in zip(texts, shares, strict=True)
        ]
    )


def source_weights(config: CompressConfig, calibration_text: str | None) -> list[list]:
    """``[name, weight]`` of each calibration source, as reports record them (a text given directly: "text")."""
    if calibration_text is not None:
        return [["text", 1.0]]
    return [[name, weight] for name, weight in config.calibration.mixture]


def calibration_texts(
    tokenizer, config: CompressConfig, calibration_text: str | None
) -> list[tuple[str, str | None, float]]:
    """``(name, text, weight)`` of every calibration source of ``config`` (``calibration_text``
    alone, named ``"text"``, when given); ``chat`` is rendered in ``tokenizer``'s chat template, and
    ``self`` has no text (the model writes it)."""
    if calibration_text is not None:
        return [("text", calibration_text, 1.0)]
    return [
        (source, None if source == corpora.SELF else corpora.read_text(source, tokenizer), weight)
        for source, weight in config.calibration.mixture
    ]


def _draw(
    model, tokenizer, text: str | None, count: int, seq_len: int, seed: int, bos: int | None
) -> torch.Tensor:
    """``count`` windows of a text, or sampled by the dense ``model`` itself when ``text`` is None."""
    if text is not None:
        return token_windows(tokenizer, text, count, seq_len, seed)
    if model is None:
        raise ValueError("'self' calibration needs the model to sample from")
    engine = Engine(model, max_batch=min(count, SELF_BATCH))
    return self_windows(engine, tokenizer, count, seq_len, seed, bos, batch_size=min(count, SELF_BATCH))


def config_windows(
    tokenizer,
    config: CompressConfig,
    calibration_text: str | None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    seed: int | None = None,
    bos: int | None = None,
    model: nn.Module | None = None,
) -> torch.Tensor:
    """Token windows ``(num_samples, seq_len)`` of the calibration text or mixture ``config`` names
    (``calibration_text`` instead, when given), each after ``bos`` if given (then ``seq_len + 1``
    tokens: the model sees its inputs as it will at run time, see :func:`svdmlp.arch.bos_token_id`).
    A ``self`` share is sampled by ``model``, which must then be the dense model.

    Defaults are the calibration's own count, length and seed; probes draw their own.
    """
    spec = config.calibration
    sources = calibration_texts(tokenizer, config, calibration_text)
    count = spec.num_samples if num_samples is None else num_samples
    seq_len = spec.seq_len if seq_len is None else seq_len
    seed = config.seed if seed is None else seed
    shares = window_shares([weight for _, _, weight in sources], count)
    windows = [
        _draw(model, tokenizer, text, share, seq_len, seed, bos)
        for (_, text, _), share in zip(sources, shares, strict=True)
    ]
    return arch.with_bos(torch.cat(windows), bos)


def training_and_validation(
    tokenizer,
    config: CompressConfig,
    calibration_text: str | None,
    steps: int,
    seq_len: int,
    seed: int,
    bos: int | None = None,
    per_source: int = 1,
    model: nn.Module | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Training windows ``(steps, seq_len)`` shared among the sources by weight, and ``per_source``
    validation windows of each source, by name (``self``: sampled by the dense ``model``).

    Each source's training and validation windows are drawn together, so they are distinct slots of
    its tokens (disjoint whenever the text holds ``share + per_source`` windows; distinct samples for
    ``self``), then split at random: healing decides on text it did not train on.
    """
    sources = calibration_texts(tokenizer, config, calibration_text)
    shares = window_shares([weight for _, _, weight in sources], steps)
    generator = torch.Generator().manual_seed(seed)
    training, validation = [], {}
    for (name, text, _), share in zip(sources, shares, strict=True):
        drawn = _draw(model, tokenizer, text, share + per_source, seq_len, seed, bos)
        order = torch.randperm(len(drawn), generator=generator)
        validation[name] = arch.with_bos(drawn[order[:per_source]], bos)
        training.append(drawn[order[per_source:]])
    mixed = torch.cat(training)[torch.randperm(steps, generator=generator)]  # sources interleaved
    return arch.with_bos(mixed, bos), validation


def tokens_hash(tokens: torch.Tensor) -> str:
    """SHA-256 of the exact calibration tokens (int64, row-major), recorded in every checkpoint."""
    return hashlib.sha256(tokens.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


@dataclass
class LayerGrams:
    """Float64 Gram matrices of one MLP's inputs: ``gate_up`` (hidden²) and ``down`` (inter²), and,
    for the ``fisher`` method, the dense model's output-gradient Grams of the layer (``outputs``).

    Each Gram's whitening is computed once, when first asked for, and kept with it: the allocation
    probe and the compression of a layer, and every keep of a sweep, share one Cholesky root (1 s for
    Qwen2.5-0.5B's 4864² down Gram on 2 cores), at the price of holding it beside the Gram; with
    ``keep_whitenings`` off (a model too big for memory) none is kept.
    """

    gate_up: torch.Tensor
    down: torch.Tensor
    tokens: int = 0
    outputs: OutputGrams | None = None
    keep_whitenings: bool = True
    _whitenings: dict[str, decompose.Whitening] = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def _input_of(projection: str) -> str:
        """Which Gram ``projection`` reads: gate and up read the MLP's input, down its own."""
        return "down" if projection == "down" else "gate_up"

    def input_gram(self, projection: str) -> torch.Tensor:
        """The Gram of ``projection``'s input."""
        return getattr(self, self._input_of(projection))

    def whitening(self, projection: str) -> decompose.Whitening:
        """The whitening of ``projection``'s input (gate and up share one)."""
        key = self._input_of(projection)
        if not self.keep_whitenings:
            return self._whitenings.get(key) or self._whiten(key)
        if key not in self._whitenings:
            self._whitenings[key] = self._whiten(key)
        return self._whitenings[key]

    def _whiten(self, key: str) -> decompose.Whitening:
        return decompose.Whitening.from_gram(getattr(self, key), damping=INPUT_DAMPING)

    def decomposition(self, weight: torch.Tensor, projection: str) -> decompose.Decomposition:
        """The SVD of ``projection``'s weight whitened by its input Gram and, with ``outputs``, weighted
        by its output-gradient Gram (damped by :data:`FISHER_DAMPING`) on the left."""
        output = None if self.outputs is None else self.outputs.whitening(projection, FISHER_DAMPING)
        return decompose.Decomposition.of(weight, self.whitening(projection), output)

    @classmethod
    def zeros(cls, hidden: int, inter: int, device) -> LayerGrams:
        """Empty accumulators for an MLP of width ``hidden`` and intermediate size ``inter``."""
        return cls(
            gate_up=torch.zeros(hidden, hidden, dtype=torch.float64, device=device),
            down=torch.zeros(inter, inter, dtype=torch.float64, device=device),
        )


class _LastLayerDone(Exception):
    """Raised by a hook once the last calibrated MLP has run: the rest of the forward is wasted work."""


@torch.no_grad()
def collect_grams(
    model: nn.Module,
    spec: arch.ArchSpec,
    windows: torch.Tensor,
    layer_indices: list[int],
    batch_size: int = 4,
    progress: bool = True,
) -> dict[int, LayerGrams]:
    """Run the calibration windows through ``model`` and return the Grams of the chosen layers."""
    layers = arch.decoder_layers(model, spec)
    device = next(model.parameters()).device
    grams: dict[int, LayerGrams] = {}
    handles = []
    for index in layer_indices:
        mlp = getattr(layers[index], spec.mlp)
        gate = getattr(mlp, spec.gate)
        down = getattr(mlp, spec.down)
        entry = LayerGrams.zeros(gate.in_features, down.in_features, device)
        grams[index] = entry

        def on_mlp_input(module, args, entry=entry):
            accumulate_gram(entry.gate_up, args[0])
            entry.tokens += args[0].numel() // args[0].shape[-1]

        def on_down_input(module, args, entry=entry):
            accumulate_gram(entry.down, args[0])

        handles.append(mlp.register_forward_pre_hook(on_mlp_input))
        handles.append(down.register_forward_pre_hook(on_down_input))

    def stop(module, args, output):
        raise _LastLayerDone

    # Later layers and the LM head (a fifth of SmolLM2's FLOPs) do not change the Grams: stop there.
    handles.append(getattr(layers[max(layer_indices)], spec.mlp).register_forward_hook(stop))
    try:
        batches = windows.split(batch_size)
        for batch in tqdm(batches, desc="calibrating", unit="batch", disable=not progress):
            try:
                model(input_ids=batch.to(device), use_cache=False)
            except _LastLayerDone:
                pass
    finally:
        for handle in handles:
            handle.remove()
    return grams


@dataclass(frozen=True)
class Calibration:
    """The activation Grams of the layers to compress and the hash of the tokens that made them.

    They depend on the model, the calibration text and seed, not on keep: a sweep over keep collects
    them once and passes them to every compression, which then shares the forward passes and each
    Gram's eigendecomposition (kept with it) across keeps.
    """

    grams: dict[int, LayerGrams]
    tokens: int
    sha256: str
    sources: list[list] = field(default_factory=list)  # [name, weight] of each text the windows came from
    outputs: dict[int, OutputGrams] = field(default_factory=dict)  # the fisher method's, by layer

    @classmethod
    def collect(
        cls,
        model: nn.Module,
        spec: arch.ArchSpec,
        windows: torch.Tensor,
        indices: list[int],
        progress: bool = True,
        sources: list[list] = (),
        fisher: bool = False,
        seed: int = 0,
        inputs: bool = True,
        spill: Path | None = None,
    ) -> Calibration:
        """The dense model's Grams of layers ``indices`` on ``windows`` (drawn from ``sources``); with
        ``fisher``, also the output-gradient Grams (a forward and backward pass per window, the
        model's own predictions sampled with ``seed``), attached to each layer's input Grams.

        Args:
            inputs: collect the input Grams (sequential calibration without a sweep to share them
                with makes its own, layer by layer).
            spill: a directory to keep the output-gradient Grams in, one file per layer, rather than
                in memory (see :func:`collect_output_grams`).
        """
        grams = collect_grams(model, spec, windows, indices, progress=progress) if inputs else {}
        sha256 = tokens_hash(windows)
        outputs = (
            collect_output_grams(
                model,
                spec,
                windows,
                indices,
                seed=seed,
                progress=progress,
                spill=spill,
                windows_sha256=sha256,
            )
            if fisher
            else {}
        )
        for index, entry in outputs.items():
            if index in grams:
                grams[index].outputs = entry
        return cls(grams, windows.numel(), sha256, [list(s) for s in sources], outputs)

    @property
    def info(self) -> dict:
        """What the compression report records about the calibration."""
        return {"tokens": self.tokens, "sha256": self.sha256, "sources": self.sources}
