"""Healing by distillation (``heal="lora"``): train the low-rank factors towards the dense model.

The factors ``V·U`` are themselves a low-rank parametrisation of each MLP weight, so healing trains
them directly, LoRA-style, with nothing to merge afterwards and no extra parameters: the
checkpoint keeps exactly the compressed layout. Every other weight is frozen. The loss is the KL
divergence from the dense model's next-token distribution to the compressed model's on calibration
windows (knowledge distillation): it pulls the model back towards what it was, rather than towards
the calibration text, so other domains heal too (a next-token loss on Shakespeare would teach
Shakespeare).

The dense teacher costs no copy of the model: compression keeps the dense MLP modules aside and
:class:`DenseTeacher` swaps them back in for the teacher's forward pass. Factors stored in a
half-precision dtype are trained through float32 master copies (AdamW's small updates vanish in
bf16). Each factor's peak learning rate follows its own scale (:func:`peak_rate`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from svdmlp import arch, lazy, lowrank
from svdmlp.compression.layer_inputs import capture, head_gradient, input_gradient, run_layer
from svdmlp.compression.sensitivity import block_kl, log_prob_blocks, summed_kl
from svdmlp.config import LoraSpec

# Fraction of the steps spent warming the learning rate up (at least one step).
WARMUP = 0.1
# The smallest RMS a relative step is taken from (Adafactor's ε₂), so that a factor near zero still moves.
RMS_FLOOR = 1e-3
# Beside a stored layer while distillation trains it on disk: a hard link to the file as it was before,
# and the layer's AdamW state.
BEFORE = ".before"
ADAMW = ".adamw"


def peak_rate(spec: LoraSpec, factor: torch.Tensor) -> float:
    """A factor's peak learning rate: ``spec.lr`` when set, else ``spec.relative_lr`` times the
    factor's RMS. AdamW moves each element by about its learning rate whatever the gradient's scale,
    so this moves every factor by the same fraction of itself: factors rescaled by c (and their
    partners by 1/c, the same model) train along the same path."""
    if spec.lr is not None:
        return spec.lr
    rms = float(factor.detach().float().square().mean().sqrt())
    return spec.relative_lr * max(RMS_FLOOR, rms)


def _adamw(factors: list[torch.Tensor], rates: list[float], scale: float = 1.0) -> torch.optim.AdamW:
    """AdamW over ``factors``, one parameter group per factor at ``scale`` times its peak rate, without
    weight decay. Fused: one pass over each factor's memory instead of a dozen elementwise ones (5x
    faster on CPU, where the per-tensor path took 14% of Qwen2.5-Coder-0.5B's distillation steps)."""
    groups = [{"params": [f], "lr": rate * scale} for f, rate in zip(factors, rates, strict=True)]
    return torch.optim.AdamW(groups, weight_decay=0.0, fused=True)


class DenseTeacher:
    """The dense MLP modules of some layers, kept before compression replaces them.

    Records every slot compression may fill (the layer's MLP, and each projection inside it) so
    that :meth:`active` can put the dense modules back whichever way the layer was compressed.
    """

    def __init__(self, model: nn.Module, spec: arch.ArchSpec, indices: list[int]):
        layers = arch.decoder_layers(model, spec)
        self._slots = []
        for index in indices:
            layer = layers[index]
            mlp = getattr(layer, spec.mlp)
            self._slots.append((layer, spec.mlp, mlp))
            for name in arch.PROJECTIONS:
                attribute = spec.projection(name)
                self._slots.append((mlp, attribute, getattr(mlp, attribute)))

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block the model is the dense one again."""
        current = [(parent, attribute, getattr(parent, attribute)) for parent, attribute, _ in self._slots]
        try:
            for parent, attribute, dense in self._slots:
                setattr(parent, attribute, dense)
            yield
        finally:
            for parent, attribute, module in reversed(current):
                setattr(parent, attribute, module)


@dataclass(frozen=True)
class DistillResult:
    """What healing did: steps, tokens, seconds and the validation KL (nats/token) before and after,
    per validation source and as their mean (each source counting once, whatever its windows)."""

    steps: int
    tokens: int
    seconds: float
    kl_before: float
    kl_after: float  # of the trained factors, also when they were reverted
    reverted: bool = False  # the validation KL rose, so the factors from before healing were put back
    kl_by_source: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> before, after
    # Each step's training KL, on a window no earlier step trained on (while steps <= windows): how
    # the run went, where the validation says only where it ended.
    losses: list[float] = field(default_factory=list)
    peak_lr: tuple[float, float] = (0.0, 0.0)  # the smallest and largest factor's peak learning rate

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "kl_before": self.kl_before,
            "kl_after": self.kl_after,
            "reverted": self.reverted,
            "kl_by_source": self.kl_by_source,
            "losses": self.losses,
            "peak_lr": list(self.peak_lr),
        }


def token_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of ``KL(teacher ‖ student)`` of the next-token distributions, in float32."""
    student = F.log_softmax(student_logits.float(), dim=-1).flatten(0, -2)
    teacher = F.log_softmax(teacher_logits.float(), dim=-1).flatten(0, -2)
    return summed_kl(teacher, student) / student.shape[0]


@torch.no_grad()
def _teacher_logits(model: nn.Module, teacher: DenseTeacher, ids: torch.Tensor) -> torch.Tensor:
    with teacher.active():
        return model(input_ids=ids, use_cache=False).logits


@torch.no_grad()
def validation_kl(model: nn.Module, teacher: DenseTeacher, windows: torch.Tensor) -> float:
    """Mean token KL from the dense model to ``model`` over ``windows``: one window at a time, the
    student's log-probabilities a few rows at a time (:func:`~svdmlp.compression.sensitivity.log_prob_blocks`),
    so that only the teacher's are whole in memory."""
    spec = arch.of_model(model)
    total = 0.0
    for window in windows:
        with teacher.active():
            dense = list(log_prob_blocks(model, spec, window[None]))
        total += block_kl(dense, log_prob_blocks(model, spec, window[None]))
    return total / windows.numel()


def kl_by_source(
    model: nn.Module, teacher: DenseTeacher, validation: dict[str, torch.Tensor]
) -> dict[str, float]:
    """:func:`validation_kl` of each source's windows."""
    return {name: validation_kl(model, teacher, windows) for name, windows in validation.items()}


def _mean(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values)


def _schedule(steps: int):
    warmup = max(1, round(WARMUP * steps))
    return lambda step: min(1.0, (step + 1) / warmup) * (1.0 - step / steps)


@contextmanager
def _trainable_factors(model: nn.Module) -> Iterator[list[tuple[nn.Parameter, torch.Tensor]]]:
    """Freeze everything but the factors, run them on the differentiable PyTorch path, and yield
    ``(parameter, float32 master)`` pairs (the master is the parameter itself when it is fp32)."""
    frozen = [p for p in model.parameters() if p.requires_grad]
    modules = lowrank.lowrank_modules(model)
    backend = modules[0].backend  # set_backend gives every module of a model the same one
    pairs = []
    for module in modules:
        for parameter in module.parameters():
            master = parameter if parameter.dtype == torch.float32 else parameter.detach().float()
            pairs.append((parameter, master.requires_grad_(True)))
            parameter.requires_grad_(True)
    try:
        for p in frozen:
            p.requires_grad_(False)
        lowrank.set_backend(model, "torch")  # the Triton kernels have no backward pass
        yield pairs
    finally:
        lowrank.set_backend(model, backend)
        for parameter, _ in pairs:
            parameter.requires_grad_(False)
            parameter.grad = None
        for p in frozen:
            p.requires_grad_(True)


def distill(
    model: nn.Module,
    teacher: DenseTeacher,
    windows: torch.Tensor,
    validation: dict[str, torch.Tensor],
    spec: LoraSpec,
    progress: bool = True,
    resident: bool = False,
) -> DistillResult:
    """Train ``model``'s low-rank factors for ``spec.steps`` steps, one window of ``windows`` each.

    A model whose layers stay on disk (:mod:`svdmlp.lazy`) is trained one layer at a time
    (:class:`_OnDisk`), with the same result; or, with ``resident``, loaded whole for the run and
    trained as a model in memory (no layer re-read, re-run and re-written each step: 40% faster on
    SmolLM2), its trained layers stored at the end.

    Args:
        windows: training tokens ``(steps, seq_len)``.
        validation: a few other windows of each calibration source, by name, on which the KL is
            measured before and after; if its mean over the sources rose, the factors from before
            healing are put back (and the result says so).

    Raises:
        ValueError: if the model has no low-rank modules, or the loss stops being finite.
    """
    if not lowrank.lowrank_modules(model):
        raise ValueError("nothing to heal: the model has no low-rank MLP modules")
    started = time.perf_counter()
    if not validation:
        raise ValueError("healing needs validation windows of at least one source")
    weights = lazy.of(model)
    if weights is None or not resident:
        return _distill(model, teacher, windows, validation, spec, progress, weights, started)
    with weights.held(*weights.units):
        result = _distill(model, teacher, windows, validation, spec, progress, None, started)
        for layer in lowrank.compressed_layers(model):
            weights.store(layer)  # trained (or put back) in memory: written before the hold ends
    return result


def _distill(model, teacher, windows, validation, spec, progress, weights, started) -> DistillResult:
    """:func:`distill` itself, on a model in memory (``weights`` None) or on disk."""
    kl_before = kl_by_source(model, teacher, validation)
    was_training = model.training
    model.eval()  # deterministic forward (no dropout) for both student and teacher
    trainer = _InMemory(model, spec) if weights is None else _OnDisk(model, weights, spec)
    losses = []
    with trainer:
        bar = tqdm(range(spec.steps), desc="healing", unit="step", disable=not progress)
        for step in bar:
            ids = windows[step % len(windows)][None].to(next(model.parameters()).device)
            target = _teacher_logits(model, teacher, ids)
            loss = trainer.step(ids, target, _schedule(spec.steps)(step))
            if not math.isfinite(loss):
                raise ValueError(
                    f"healing diverged: the loss is {loss} at step {step}; lower the learning "
                    "rate (--heal-relative-lr, or --heal-lr) or check the model for inf/NaN activations"
                )
            losses.append(loss)
            bar.set_postfix(kl=f"{loss:.4f}")
    model.train(was_training)
    kl_after = kl_by_source(model, teacher, validation)
    reverted = _mean(kl_after) > _mean(kl_before)
    if reverted:  # healing must never leave the model further from the dense one than it found it
        trainer.restore()
    trainer.close()
    return DistillResult(
        steps=spec.steps,
        tokens=spec.steps * windows.shape[1],
        seconds=time.perf_counter() - started,
        kl_before=_mean(kl_before),
        kl_after=_mean(kl_after),
        reverted=reverted,
        kl_by_source={name: {"before": kl_before[name], "after": kl_after[name]} for name in validation},
        losses=losses,
        peak_lr=(min(trainer.peaks), max(trainer.peaks)),
    )


class _InMemory:
    """Training of a model in memory: one AdamW over every factor (float32 master copies), each
    factor its own parameter group at its own peak rate."""

    def __init__(self, model: nn.Module, spec: LoraSpec):
        self.model, self.lora = model, spec
        self.factors = [p for m in lowrank.lowrank_modules(model) for p in m.parameters()]
        self.before = [p.detach().clone() for p in self.factors]

    def __enter__(self):
        self._context = _trainable_factors(self.model)
        self.pairs = self._context.__enter__()
        self.peaks = [peak_rate(self.lora, master) for _, master in self.pairs]
        masters = [master for _, master in self.pairs]
        self.optimizer = _adamw(masters, self.peaks)
        return self

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def step(self, ids: torch.Tensor, target: torch.Tensor, scale: float) -> float:
        """One step at ``scale`` times each factor's peak rate; the training KL before it."""
        loss = token_kl(self.model(input_ids=ids, use_cache=False).logits, target)
        if not torch.isfinite(loss):
            return float(loss.detach())
        loss.backward()
        for parameter, master in self.pairs:
            if master is not parameter:
                master.grad = parameter.grad.float()
                parameter.grad = None
        for group, peak in zip(self.optimizer.param_groups, self.peaks, strict=True):
            group["lr"] = peak * scale
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for parameter, master in self.pairs:
                if master is not parameter:
                    parameter.copy_(master)
        return float(loss.detach())

    def restore(self) -> None:
        """Put back the factors from before training."""
        with torch.no_grad():
            for parameter, saved in zip(self.factors, self.before, strict=True):
                parameter.copy_(saved)

    def close(self) -> None:
        self.before.clear()


class _OnDisk:
    """Training of a model whose layers stay on disk, one decoder layer at a time.

    Each step runs the layers forward keeping their inputs (a window's hidden states per layer), takes
    the loss gradient at the top, then runs each layer again from the last down, with gradients: its
    factors' gradients are complete once its backward has run (the layers above were run with their
    weights from before the step), so its AdamW step is taken there and the layer written back, with
    its optimizer state in a file beside it. Without gradient clipping this is the same update as one
    AdamW over all factors. The factors are the layers' own float32 files (no master copies); each
    factor's peak rate is taken from it at its layer's first step, before any update.
    """

    def __init__(self, model: nn.Module, weights: lazy.DiskWeights, spec: LoraSpec):
        self.model, self.weights, self.lora = model, weights, spec
        self.rates: dict[Path, list[float]] = {}  # each trained layer's factors' peak rates
        self.spec = arch.of_model(model)
        self.layers = arch.decoder_layers(model, self.spec)
        self.trained = lowrank.compressed_layers(model)
        if weights.dtype != torch.float32:
            raise ValueError(
                "distillation of a model on disk trains its stored layers in place, in float32: "
                "pass --dtype float32"
            )
        if any(id(layer) not in weights.stored for layer in self.trained):
            raise ValueError("distillation of a model on disk needs its compressed layers stored first")
        self.before = {}
        for layer in self.trained:  # hard links: a stored layer is rewritten by replacing its file
            path = weights.stored[id(layer)]
            saved = path.with_name(path.name + BEFORE)
            saved.unlink(missing_ok=True)
            os.link(path, saved)
            self.before[path] = saved

    def __enter__(self):
        self.frozen = [(p, p.requires_grad) for p in self.model.parameters()]
        for p, _ in self.frozen:
            p.requires_grad_(False)
        self.backend = lowrank.lowrank_modules(self.model)[0].backend
        lowrank.set_backend(self.model, "torch")  # the Triton kernels have no backward pass
        return self

    def __exit__(self, *exc):
        lowrank.set_backend(self.model, self.backend)
        for p, flag in self.frozen:
            p.requires_grad_(flag)

    @property
    def peaks(self) -> list[float]:
        return [rate for rates in self.rates.values() for rate in rates]

    def step(self, ids: torch.Tensor, target: torch.Tensor, scale: float) -> float:
        """One step at ``scale`` times each factor's peak rate; the training KL before it."""
        batch = capture(self.model, self.spec, ids, len(self.layers) - 1, 1)[0]
        inputs, hidden = [], batch.hidden
        with torch.no_grad():
            for index, layer in enumerate(self.layers):
                with lazy.held(self.model, layer):
                    inputs.append(hidden)
                    hidden = run_layer(layer, hidden, batch.kwargs[index])
        with lazy.held(self.model, self.model.get_output_embeddings()):  # read once for all its rows
            # The KL is a mean over the window's tokens: each block of rows adds its share of it.
            share = 1 / ids.shape[1]
            loss, gradient = head_gradient(
                self.model,
                self.spec,
                hidden,
                lambda logits, rows: token_kl(logits, target[:, rows]) * (len(rows) * share),
            )
        if not math.isfinite(loss):
            return loss
        for index in reversed(range(len(self.layers))):
            layer = self.layers[index]
            with lazy.held(self.model, layer):
                factors = [p for module in lowrank.lowrank_modules(layer) for p in module.parameters()]
                for parameter in factors:
                    parameter.requires_grad_(True)
                gradient = input_gradient(layer, inputs.pop(), batch.kwargs[index], gradient)
                if factors:
                    self._adamw(layer, factors, scale)
                    self.weights.store(layer)
                for parameter in factors:
                    parameter.requires_grad_(False)
        return loss

    def _adamw(self, layer: nn.Module, factors: list[nn.Parameter], scale: float) -> None:
        """One AdamW step on ``factors``, its state read from and written to the layer's state file."""
        path = self.weights.stored[id(layer)]
        state_path = path.with_name(path.name + ADAMW)
        if path not in self.rates:
            self.rates[path] = [peak_rate(self.lora, p) for p in factors]
        optimizer = _adamw(factors, self.rates[path], scale)
        if state_path.is_file():
            saved = load_file(state_path)
            for k, parameter in enumerate(factors):
                optimizer.state[parameter] = {
                    key: saved[f"{k}.{key}"] for key in ("step", "exp_avg", "exp_avg_sq")
                }
        with torch.no_grad():
            optimizer.step()
        state = {
            f"{k}.{key}": optimizer.state[p][key]
            for k, p in enumerate(factors)
            for key in ("step", "exp_avg", "exp_avg_sq")
        }
        save_file(state, state_path)
        for parameter in factors:
            parameter.grad = None

    def restore(self) -> None:
        """Put back every trained layer's file from before training."""
        for path, saved in self.before.items():
            os.replace(saved, path)
        self.before.clear()

    def close(self) -> None:
        """Delete the copies from before training and the optimizer states."""
        for saved in self.before.values():
            saved.unlink(missing_ok=True)
        for layer in self.trained:
            path = self.weights.stored[id(layer)]
            path.with_name(path.name + ADAMW).unlink(missing_ok=True)
