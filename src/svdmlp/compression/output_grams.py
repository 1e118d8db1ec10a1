"""Output-gradient Grams: ``G_out = Σ g·gᵀ`` of each MLP projection's output gradient ``g = ∂loss/∂y``.

Input whitening weighs a projection's error ``E`` by how often each input direction occurs
(``tr(E·XᵀX·Eᵀ)``); to second order the loss increase is ``tr(G_out·E·XᵀX·Eᵀ)`` in the Kronecker-factored
(K-FAC) approximation of the Fisher, which also weighs the output directions by how much the loss
cares about them (:func:`svdmlp.decompose.two_sided_svd`).

The dense model runs forward and backward over the calibration windows, one decoder layer at a time
(so that a model on disk holds one layer, :mod:`svdmlp.lazy`). Its parameters are frozen for the
duration (no weight gradients are computed or kept); the gradient enters at each layer's input, and
forward hooks on the gate, up and down projections put a tensor hook on each output that adds the
batch's ``gᵀg`` into a float64 accumulator. Every hook is removed, and the parameters'
``requires_grad`` restored, in ``finally``.

Two losses (``loss``):

- ``"sampled"``: cross-entropy against tokens drawn from the model's own predictive distribution at
  every position, seeded. ``E[g·gᵀ]`` over those draws is the true Fisher (the Gauss-Newton matrix of
  the cross-entropy), the curvature of the KL divergence to the dense model, which is what
  compression perturbs.
- ``"labels"``: the model's next-token loss on the window itself (the empirical Fisher); its
  gradients carry the model's errors on the text, not only its sensitivity.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from tqdm.auto import tqdm

from svdmlp import arch, decompose, lazy
from svdmlp.compression.gram import BufferedGram
from svdmlp.compression.layer_inputs import capture, head_gradient, input_gradient, run_layer

LOSSES = ("sampled", "labels")
# Spilled Grams are stored in float32: half the disk and the reading of float64 (every layer's Grams
# wait on disk between the backward sweep and their factorisation: 36 GB for Qwen2.5-1.5B in float64,
# 110 GB for Llama-3.1-8B). They are accumulated in float64 and used damped by 0.1·mean(diag)
# (calibration.FISHER_DAMPING), a million times float32's relative rounding.
SPILL_DTYPE = torch.float32


@dataclass
class OutputGrams:
    """Float64 Grams of one MLP's output gradients: ``gate`` and ``up`` (inter²), ``down`` (hidden²).

    In memory, each whitening (at each damping) is computed once, when first asked for, and kept.
    Spilled to disk (:meth:`spill`), the Grams are in a file, read when asked for and never kept: a big
    model's Grams are made once and used twice (allocation probes, then the factorisation), one
    projection at a time, and their Cholesky roots are cheap to make again each time. The file holds
    them in float32 (:data:`SPILL_DTYPE`).
    """

    gate: torch.Tensor | None
    up: torch.Tensor | None
    down: torch.Tensor | None
    tokens: int = 0
    path: Path | None = None  # the spilled Grams
    _whitenings: dict[tuple[str, float], decompose.Whitening] = field(
        default_factory=dict, repr=False, compare=False
    )

    def gram(self, projection: str) -> torch.Tensor:
        """The Gram of ``projection``'s output gradient ("gate", "up" or "down"), read from its file
        when spilled."""
        if self.path is None:
            return getattr(self, projection)
        with safe_open(self.path, framework="pt") as handle:  # cast in blocks: one float64 buffer
            return lazy.read_tensor(handle, self.path, projection, torch.float64, torch.device("cpu"))

    def spill(self, path: Path) -> None:
        """Move the Grams to the file ``path`` (in :data:`SPILL_DTYPE`), each float64 Gram let go as
        soon as its copy is made (memory: the Grams and one copy)."""
        stored = {}
        for name in arch.PROJECTIONS:
            stored[name] = getattr(self, name).to(SPILL_DTYPE)
            setattr(self, name, None)
        lazy.save_atomic(stored, path, {})
        self.path = path

    def discard(self) -> None:
        """Delete the spilled file: it will not be asked for again."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def whitening(self, projection: str, damping: float = 0.0) -> decompose.Whitening:
        """The root of ``projection``'s Gram damped by ``damping`` (:meth:`decompose.Whitening.from_gram`)."""
        if self.path is not None:  # read for this root alone: it becomes the root
            return decompose.Whitening.from_gram(
                self.gram(projection), damping=damping, reload=lambda: self.gram(projection)
            )
        key = (projection, float(damping))
        if key not in self._whitenings:
            self._whitenings[key] = decompose.Whitening.from_gram(self.gram(projection), damping=damping)
        return self._whitenings[key]

    @classmethod
    def zeros(cls, hidden: int, inter: int, device) -> OutputGrams:
        """Empty accumulators for an MLP of width ``hidden`` and intermediate size ``inter``."""

        def square(n: int) -> torch.Tensor:
            return torch.zeros(n, n, dtype=torch.float64, device=device)

        return cls(gate=square(inter), up=square(inter), down=square(hidden))


def _loss(batch: torch.Tensor, loss: str, generator: torch.Generator):
    """The summed cross-entropy whose gradients the Grams collect (see the module docstring), of the
    windows ``batch (B, L)``: as ``loss(logits, positions)``, the part from a block of positions
    (:func:`~svdmlp.compression.layer_inputs.head_gradient`). The sampled loss's uniform draws are made
    for the whole batch first, one per token in row-major order, so that the blocks draw what one pass
    over the whole logits drew."""
    length = batch.shape[1]
    uniform = torch.rand(batch.numel(), 1, generator=generator).reshape(batch.shape)

    def block(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if loss == "labels":  # the next token's; the last position (a block's last row) has none
            positions = positions[positions < length - 1]
            flat = logits[:, : len(positions)].float().reshape(-1, logits.shape[-1])
            return F.cross_entropy(flat, batch[:, positions + 1].reshape(-1), reduction="sum")
        flat = logits.float().reshape(-1, logits.shape[-1])
        with torch.no_grad():
            targets = sample(flat.softmax(-1), uniform[:, positions.cpu()].reshape(-1, 1))
        return F.cross_entropy(flat, targets, reduction="sum")

    return block


def sample(probabilities: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One draw from each row of ``probabilities (rows, vocab)``, by inverting its cumulative sum at
    ``uniform (rows, 1)``, draws in [0, 1) (made on the CPU by a seeded generator and moved to the
    rows' device). ``torch.multinomial`` does the same work about 9 times slower on CPU (1.9 s against
    0.2 s for 513 rows of Qwen's 151,936 tokens), which was a minute of a 32-window Qwen calibration."""
    cumulative = probabilities.cumsum(-1)
    uniform = uniform.to(cumulative.device)
    # right=True: the first token whose cumulative probability exceeds the draw, so that a token of
    # probability zero is never drawn; the clamp covers a draw above a total rounded below 1.
    drawn = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True)
    return drawn.squeeze(1).clamp_(max=probabilities.shape[1] - 1)


def _gradient_gram_hook(gram: BufferedGram):
    """A forward hook that makes the output's gradient, once backward reaches it, add ``gᵀg`` into ``gram``."""

    def on_output(module, args, output):
        if output.requires_grad:  # the tensor hook lives and dies with this batch's graph
            output.register_hook(gram.add)

    return on_output


def collect_output_grams(
    model: nn.Module,
    spec: arch.ArchSpec,
    windows: torch.Tensor,
    layer_indices: list[int],
    loss: str = "sampled",
    batch_size: int = 1,
    seed: int = 0,
    progress: bool = True,
    spill: Path | None = None,
    windows_sha256: str | None = None,
) -> dict[int, OutputGrams]:
    """Run ``windows`` forward and backward through ``model``; the output-gradient Grams of the chosen layers.

    Layer by layer, so that a model whose layers stay on disk (:mod:`svdmlp.lazy`) holds one at a
    time: a forward pass keeps the hidden states entering each layer from the first chosen one on;
    the head gives the loss gradient at the top; then each layer, from the last down, runs again on
    its inputs with gradients and passes the gradient at its input down (the chosen layers' hooks
    collect their projections' output gradients on the way).

    Args:
        windows: token windows ``(n, L)``, the BOS column already put first where the model wants one.
        loss: ``"sampled"`` (true Fisher) or ``"labels"`` (empirical Fisher), see the module docstring.
        seed: the seed of the ``"sampled"`` draws.
        spill: a directory where each layer's Grams are kept as soon as they are made
            (:meth:`OutputGrams.spill`): memory then holds one layer's at a time.
            It also holds the hidden states entering each layer and, after each layer of the
            backward sweep, the gradient at that layer's input (:data:`GRADIENT_FILE`): a sweep
            stopped there (a kill, the end of a session) continues from the layer it stopped at
            when called again with the same arguments, its forward pass not run again.
        windows_sha256: the windows' tokens' SHA-256 (:func:`svdmlp.compression.calibration.tokens_hash`),
            which the files a stopped sweep leaves in ``spill`` are marked with; without it they are
            never continued.

    The model is left as it was found: parameters' ``requires_grad`` and ``.grad``, its hooks, its mode.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    layers = arch.decoder_layers(model, spec)
    first, wanted = min(layer_indices), set(layer_indices)
    batches = capture(model, spec, windows, len(layers) - 1, batch_size)
    inputs = _LayerInputs(spill)
    sweep = {"windows": windows_sha256 or "", "loss": loss, "seed": str(seed), "batch": str(batch_size)}
    sweep |= {"first": str(first), "wanted": ",".join(map(str, sorted(wanted)))}
    stopped = _stopped_sweep(spill, sweep, batches[0].hidden.device)
    parameters = list(model.parameters())
    requires_grad = [p.requires_grad for p in parameters]
    try:
        for p in parameters:
            p.requires_grad_(False)
        if stopped is None:
            gradients = _forward_and_head(
                model, spec, windows, batches, inputs, first, loss, seed, batch_size, progress, sweep
            )
            top = len(layers) - 1
        else:
            top, gradients = stopped
        grams = {
            index: OutputGrams(None, None, None, tokens=windows.numel(), path=_grams_path(spill, index))
            for index in wanted
            if index > top
        }
        for batch in batches:  # each layer's inputs come from ``inputs``: the last ones here are not needed
            batch.hidden = None
        order = range(top, first - 1, -1)
        for index in tqdm(order, desc="output grams (backward)", unit="layer", disable=not progress):
            gradients = _backward_through(
                model, spec, index, batches, inputs.take(index, gradients[0].device), gradients, grams, wanted
            )
            if spill is not None:
                if index in grams:
                    grams[index].spill(_grams_path(spill, index))
                _save_batches(Path(spill) / GRADIENT_FILE, gradients, {**sweep, "next": str(index - 1)})
                inputs.drop(index)
    finally:
        for p, flag in zip(parameters, requires_grad, strict=True):
            p.requires_grad_(flag)
    if spill is not None:
        (Path(spill) / GRADIENT_FILE).unlink(missing_ok=True)
    return grams


# In a spill directory, the gradient at the input of the layer the backward sweep has reached, with
# what identifies the sweep (its metadata) and the next layer to run back through.
GRADIENT_FILE = "output-grams-gradient.safetensors"


# In a spill directory, the hidden states entering each layer that the forward pass has reached (their
# files' names start with this).
INPUTS = "inputs-"


def _grams_path(spill: Path | None, index: int) -> Path | None:
    return None if spill is None else Path(spill) / f"output-grams-{index:05d}.safetensors"


def _forward_and_head(model, spec, windows, batches, inputs, first, loss, seed, batch_size, progress, sweep):
    """Run every layer forward, keeping the hidden states entering those from ``first`` on (a pass of
    this ``sweep`` stopped with some of them on disk continues from the last one kept); the loss
    gradient at the last layer's output, by batch."""
    layers = arch.decoder_layers(model, spec)
    resumed = inputs.last(first, sweep)
    if resumed is not None:
        device = batches[0].hidden.device
        for batch, hidden in zip(batches, inputs.take(resumed, device), strict=True):
            batch.hidden = hidden
    begin = 0 if resumed is None else resumed
    forward = tqdm(
        range(begin, len(layers)),
        desc="output grams (forward)",
        unit="layer",
        initial=begin,
        total=len(layers),
        disable=not progress,
    )
    with torch.no_grad():
        for index in forward:
            layer = layers[index]
            with lazy.held(model, layer):
                if index >= first and index != resumed:
                    inputs.put(index, [batch.hidden for batch in batches], sweep)
                for batch in batches:
                    batch.hidden = run_layer(layer, batch.hidden, batch.kwargs[index])
    generator = torch.Generator().manual_seed(seed)
    device = batches[0].hidden.device
    with lazy.held(model, model.get_output_embeddings()):
        return [
            head_gradient(model, spec, batch.hidden, _loss(ids.to(device), loss, generator))[1]
            for ids, batch in zip(windows.split(batch_size), batches, strict=True)
        ]


def _save_batches(path: Path, batches: list[torch.Tensor], metadata: dict[str, str]) -> None:
    """Keep one tensor per batch in ``path``, atomically (a stop while writing leaves the last one)."""
    lazy.save_atomic({str(k): batch.contiguous() for k, batch in enumerate(batches)}, path, metadata)


def _read_batches(path: Path, device: torch.device) -> Iterator[torch.Tensor]:
    """The tensors :func:`_save_batches` kept in ``path``, in order, on ``device``, each read through its
    own opening of the file, so that the pages it maps are let go with it. Read through one opening,
    every page read stays resident until the last tensor is freed: by the end of a backward layer a
    third copy of the windows' hidden states (0.7 GB of file-backed RSS at Qwen2.5-Coder-1.5B's 224
    windows, measured)."""
    batch = 0
    while True:
        with safe_open(path, framework="pt") as handle:
            if str(batch) not in handle.keys():
                return
            tensor = handle.get_tensor(str(batch)).to(device)
        yield tensor
        batch += 1


def stopped_at(spill: Path) -> int | None:
    """The next layer a backward sweep stopped in ``spill`` would run back through, or None."""
    path = Path(spill) / GRADIENT_FILE
    if not lazy.intact(path):  # none, or not whole: nothing to continue from
        return None
    with safe_open(path, framework="pt") as handle:
        return int(lazy.saved_metadata(handle).get("next", -1))


def kept(spill: Path) -> str:
    """What a calibration stopped in ``spill`` kept to continue from, in words ("" when nothing): the
    layer its backward pass had come down to, or the layer its forward pass had reached; what a stopped
    run keeps its directory for."""
    backward = stopped_at(spill)
    if backward is not None:
        return f"the calibration's backward pass down to layer {backward + 1}"
    forward = [int(path.stem.removeprefix(INPUTS)) for path in Path(spill).glob(f"{INPUTS}*.safetensors")]
    if forward:
        return f"the calibration's forward pass up to layer {max(forward) + 1}"
    return ""


def _stopped_sweep(spill: Path | None, sweep: dict, device) -> tuple[int, list[torch.Tensor]] | None:
    """Where a sweep of the same windows, loss and layers stopped in ``spill``: the next layer to run
    back through and the gradient at its output (on ``device``); None when there is none to continue
    (then any gradient file left there, of another sweep, is ignored and written over)."""
    path = None if spill is None or not sweep["windows"] else Path(spill) / GRADIENT_FILE
    if path is None or not lazy.intact(path):
        return None
    with safe_open(path, framework="pt") as handle:
        metadata = lazy.saved_metadata(handle)
        if {key: metadata.get(key) for key in sweep} != sweep:
            return None
        next_layer = int(metadata["next"])
        kept = _LayerInputs(spill)
        if not all(kept.has(index, sweep) for index in range(int(sweep["first"]), next_layer + 1)):
            return None
        wanted = [int(index) for index in sweep["wanted"].split(",") if int(index) > next_layer]
        if not all(lazy.intact(_grams_path(spill, index)) for index in wanted):  # the Grams made so far
            return None
    return next_layer, list(_read_batches(path, device))


class _LayerInputs:
    """The hidden states entering each layer, in memory or, with ``spill``, one file per layer."""

    def __init__(self, spill: Path | None):
        self.spill, self.kept = spill, {}

    def _path(self, index: int) -> Path:
        return Path(self.spill) / f"{INPUTS}{index:05d}.safetensors"

    def put(self, index: int, batches: list[torch.Tensor], sweep: dict) -> None:
        """Keep the inputs of layer ``index``; on disk atomically, with what identifies the ``sweep``."""
        if self.spill is None:
            self.kept[index] = batches
            return
        _save_batches(self._path(index), batches, sweep)

    def last(self, first: int, sweep: dict) -> int | None:
        """The last layer whose inputs a stopped forward pass of ``sweep`` kept on disk, those of every
        layer from ``first`` to it kept too; None when there are none."""
        index = first
        while self.has(index, sweep):
            index += 1
        return index - 1 if index > first else None

    def has(self, index: int, sweep: dict) -> bool:
        """Whether the inputs of layer ``index`` that ``sweep`` kept are on disk (never for a sweep
        whose windows are not identified)."""
        if self.spill is None or not sweep["windows"] or not lazy.intact(self._path(index)):
            return False
        with safe_open(self._path(index), framework="pt") as handle:
            return lazy.saved_metadata(handle) == sweep

    def take(self, index: int, device: torch.device) -> Iterator[torch.Tensor]:
        """The inputs of layer ``index`` on ``device``, batch by batch, each one let go here as it is
        handed out. In memory they are forgotten; on disk they stay until :meth:`drop`, for a sweep
        stopped in this layer to run it again."""
        if self.spill is None:
            kept = self.kept.pop(index)
            while kept:
                yield kept.pop(0)
            return
        yield from _read_batches(self._path(index), device)

    def drop(self, index: int) -> None:
        """Delete the file of layer ``index``'s inputs: the sweep has gone below it."""
        self._path(index).unlink()


def _backward_through(model, spec, index, batches, inputs, gradients, grams, wanted) -> list[torch.Tensor]:
    """Run layer ``index`` again on its ``inputs`` (batch by batch) and take the loss ``gradients`` at
    its output to its input; a chosen layer adds its projections' output-gradient Grams into
    ``grams[index]``.

    The inputs are taken and the gradients' list emptied batch by batch as the gradients below are
    made, so that the layer holds two copies of the windows' hidden states, not three (0.7 GB each for
    Qwen2.5-Coder-1.5B's 224 windows)."""
    layer = arch.decoder_layers(model, spec)[index]
    handles, buffered = [], []
    with lazy.held(model, layer):
        if index in wanted:
            mlp = getattr(layer, spec.mlp)
            gate = getattr(mlp, spec.gate)
            entry = grams[index] = OutputGrams.zeros(gate.in_features, gate.out_features, gradients[0].device)
            for name in arch.PROJECTIONS:
                buffered.append(BufferedGram(entry.gram(name)))
                projection = getattr(mlp, spec.projection(name))
                handles.append(projection.register_forward_hook(_gradient_gram_hook(buffered[-1])))
        try:
            if len(batches) != len(gradients):
                raise ValueError(f"{len(batches)} batches and {len(gradients)} gradients")
            below = []
            for batch, hidden in zip(batches, inputs, strict=True):
                gradient = gradients.pop(0)
                below.append(input_gradient(layer, hidden, batch.kwargs[index], gradient))
                if index in wanted:
                    grams[index].tokens += hidden.shape[0] * hidden.shape[1]
                del hidden, gradient
        finally:
            for handle in handles:
                handle.remove()
        for gram in buffered:
            gram.flush()
    return below
