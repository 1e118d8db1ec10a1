"""Output-gradient Grams: ``G_out = Σ g·gᵀ`` of each MLP projection's output gradient ``g = ∂loss/∂y``.

Input whitening weighs a projection's error ``E`` by how often each input direction occurs
(``tr(E·XᵀX·Eᵀ)``); to second order the loss increase is ``tr(G_out·E·XᵀX·Eᵀ)`` in the Kronecker-factored
(K-FAC) approximation of the Fisher, which also weighs the output directions by how much the loss
cares about them (:func:`svdmlp.compression.decompose.two_sided_svd`).

The dense model runs forward and backward over the calibration windows. Its parameters are frozen for
the duration (no weight gradients are computed or kept); the gradient enters at the input embeddings,
and forward hooks on the gate, up and down projections put a tensor hook on each output that adds the
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

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from svdmlp import arch
from svdmlp.compression import decompose
from svdmlp.compression.gram import accumulate_gram

LOSSES = ("sampled", "labels")


@dataclass
class OutputGrams:
    """Float64 Grams of one MLP's output gradients: ``gate`` and ``up`` (inter²), ``down`` (hidden²).

    Each whitening (at each damping) is computed once, when first asked for, and kept: one
    eigendecomposition per Gram serves every damping (:meth:`decompose.Whitening.damped`).
    """

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    tokens: int = 0
    _whitenings: dict[tuple[str, float], decompose.Whitening] = field(
        default_factory=dict, repr=False, compare=False
    )

    def gram(self, projection: str) -> torch.Tensor:
        """The Gram of ``projection``'s output gradient ("gate", "up" or "down")."""
        return getattr(self, projection)

    def whitening(self, projection: str, damping: float = 0.0) -> decompose.Whitening:
        """The root of :func:`decompose.damped_gram` ``(gram(projection), damping)``."""
        key = (projection, float(damping))
        if key not in self._whitenings:
            base = self._whitenings.get((projection, 0.0))
            if base is None:
                base = self._whitenings[(projection, 0.0)] = decompose.Whitening.from_gram(
                    self.gram(projection)
                )
            self._whitenings[key] = base if damping == 0 else base.damped(damping)
        return self._whitenings[key]

    @classmethod
    def zeros(cls, hidden: int, inter: int, device) -> OutputGrams:
        """Empty accumulators for an MLP of width ``hidden`` and intermediate size ``inter``."""

        def square(n: int) -> torch.Tensor:
            return torch.zeros(n, n, dtype=torch.float64, device=device)

        return cls(gate=square(inter), up=square(inter), down=square(hidden))


def _loss(logits: torch.Tensor, batch: torch.Tensor, loss: str, generator: torch.Generator) -> torch.Tensor:
    """The summed cross-entropy whose gradients the Grams collect (see the module docstring)."""
    if loss == "labels":
        flat = logits[:, :-1].float().reshape(-1, logits.shape[-1])
        return F.cross_entropy(flat, batch[:, 1:].reshape(-1), reduction="sum")
    flat = logits.float().reshape(-1, logits.shape[-1])
    with torch.no_grad():
        probabilities = flat.softmax(-1)
        # multinomial draws on the CPU generator's device; sample there and move the draws back.
        targets = torch.multinomial(probabilities.cpu(), 1, generator=generator).squeeze(1)
    return F.cross_entropy(flat, targets.to(flat.device), reduction="sum")


def _gradient_gram_hook(target: torch.Tensor):
    """A forward hook that makes the output's gradient, once backward reaches it, add ``gᵀg`` into ``target``."""

    def on_output(module, args, output):
        if output.requires_grad:  # the tensor hook lives and dies with this batch's graph
            output.register_hook(lambda grad: accumulate_gram(target, grad))

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
) -> dict[int, OutputGrams]:
    """Run ``windows`` forward and backward through ``model``; the output-gradient Grams of the chosen layers.

    Args:
        windows: token windows ``(n, L)``, the BOS column already put first where the model wants one.
        loss: ``"sampled"`` (true Fisher) or ``"labels"`` (empirical Fisher), see the module docstring.
        seed: the seed of the ``"sampled"`` draws.

    The model is left as it was found: parameters' ``requires_grad`` and ``.grad``, its hooks, its mode.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    layers = arch.decoder_layers(model, spec)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    grams: dict[int, OutputGrams] = {}
    handles = []
    parameters = list(model.parameters())
    requires_grad = [p.requires_grad for p in parameters]
    try:
        for p in parameters:
            p.requires_grad_(False)
        for index in layer_indices:
            mlp = getattr(layers[index], spec.mlp)
            gate = getattr(mlp, spec.gate)
            entry = OutputGrams.zeros(gate.in_features, gate.out_features, device)
            grams[index] = entry
            for name in arch.PROJECTIONS:
                projection = getattr(mlp, spec.projection(name))
                handles.append(projection.register_forward_hook(_gradient_gram_hook(entry.gram(name))))

        def start_graph(module, args, output):  # the gradient enters here: no weight gradients
            return output.detach().requires_grad_(True)

        handles.append(model.get_input_embeddings().register_forward_hook(start_graph))
        for batch in tqdm(windows.split(batch_size), desc="output grams", unit="batch", disable=not progress):
            batch = batch.to(device)
            with torch.enable_grad():
                logits = model(input_ids=batch, use_cache=False).logits
                _loss(logits, batch, loss, generator).backward()
            for index in layer_indices:
                grams[index].tokens += batch.numel()
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in zip(parameters, requires_grad, strict=True):
            p.requires_grad_(flag)
    return grams
