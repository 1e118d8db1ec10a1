"""Storing a compressed model's factors quantized (``--factor-bits 8|4``), with or without calibration data.

Round to nearest rounds each entry of each factor on its own. When the recipe has calibration windows,
the factors are quantized one layer at a time instead, each layer on the outputs of the layers before
it as already quantized, and in each low-rank module:

- the shrink factor ``U`` (the one that reads ``x``) is rounded by GPTQ with the Gram of ``x``;
- the expand factor ``V`` is first refit, in closed form, to what the float module outputs, now from the
  rounded ``U``'s outputs ``z`` (least squares on their Gram), then rounded by GPTQ with that Gram. In a
  gated MLP, down's ``V`` is refit to the float MLP's output from the intermediate that the already
  rounded gate and up give, so that it also makes up for their error.

Both are measured, on the calibration windows: the relative error of each module's output with its
factors rounded to nearest and as stored (:func:`quantize_layers`' report).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from svdmlp import lazy, lowrank
from svdmlp.activations import activate
from svdmlp.backends import torch_ref
from svdmlp.compression import sequential
from svdmlp.compression.gram import accumulate_gram, accumulate_product
from svdmlp.factor_layout import GatedFactors
from svdmlp.int_weights import QuantizedMatrix, Scheme

_RIDGE = 1e-6  # of the mean diagonal, added to a Gram before a least-squares solve: only against singularity


def quantize_layers(
    model: nn.Module, spec, layers, how: Scheme, windows: torch.Tensor | None, store, progress=True
):
    """Quantize every compressed layer's factors by ``how``: calibrated on ``windows`` (tokens
    ``(count, seq_len)``) when given, else rounded to nearest; ``store(index)`` writes a layer of a
    model on disk back once done. Returns the report: bytes before and after, and the errors."""
    started = time.perf_counter()
    totals = {"before": 0, "after": 0, "params": 0}
    errors: list[dict[str, float]] = []

    def tally(modules, quantize) -> None:
        """Quantize ``modules`` (``quantize(module)``: its error records), counting their bytes."""
        totals["before"] += sum(module.factor_bytes() for module in modules)
        totals["params"] += sum(p.numel() for module in modules for p in module.parameters())
        for module in modules:
            errors.extend(quantize(module))
        totals["after"] += sum(module.factor_bytes() for module in modules)

    indices = [i for i, layer in enumerate(layers) if lowrank.lowrank_modules(layer)]  # no weights read
    if windows is None:
        for index in indices:
            with lazy.held(model, layers[index]):
                modules = lowrank.lowrank_modules(layers[index])
                tally(modules, lambda m: [{"weight": e} for e in m.quantize_factors(how).values()])
            store(index)
    else:
        previous = None
        for index, inputs in sequential.lowrank_inputs(model, spec, windows, indices, progress=progress):
            store(previous)  # it has run on the calibration windows as quantized: written, dropped
            tally(list(inputs), lambda m, inputs=inputs: [_quantize_calibrated(m, inputs[m], how)])
            del inputs  # before the walk runs the next layer
            previous = index
        store(previous)
    report = {
        "scheme": how.name,
        "bits": how.bits,
        "group": how.group,
        "method": "rtn" if windows is None else "gptq+refit",
        "factor_params": totals["params"],
        "factor_bytes_before": totals["before"],
        "factor_bytes": totals["after"],
        "seconds": time.perf_counter() - started,
    }
    for key in errors[0] if errors else ():
        values = [e[key] for e in errors]
        report[f"{key}_error_mean"], report[f"{key}_error_max"] = sum(values) / len(values), max(values)
    return report


@torch.no_grad()
def _quantize_calibrated(module, batches: list[torch.Tensor], how: Scheme) -> dict[str, float]:
    """Quantize one low-rank module's factors from its input ``batches``; the relative output error on
    them, rounded to nearest (``rtn``) and as stored (``output``)."""
    xs = [batch.detach().reshape(-1, batch.shape[-1]).float() for batch in batches]
    floats = {name: getattr(module, name).detach().float() for name in module.FACTORS}
    references = [_forward(module, floats, x) for x in xs]  # the float module's outputs, made once
    gram = _gram(xs)
    if isinstance(module, lowrank.LowRankLinear):
        shrink = QuantizedMatrix.of(floats["u_t"], how, hessian=gram)
        quantized = {"u_t": shrink, "v_t": _refit(_restored(shrink), floats["u_t"], floats["v_t"], gram, how)}
    else:
        quantized = _quantize_gated(module, floats, xs, references, gram, how)
    rounded = {name: QuantizedMatrix.of(floats[name], how) for name in module.FACTORS}
    errors = {
        "rtn": _relative_error(module, rounded, xs, references),
        "output": _relative_error(module, quantized, xs, references),
    }
    module.use_quantized(quantized, how)
    return errors


def _quantize_gated(module, floats, xs, references, gram, how) -> dict[str, QuantizedMatrix]:
    """Gate and up share the rounded shrink factor, each refits its own expand factor; then down, on
    the intermediate the rounded gate and up give, refit to the float MLP's output."""
    r_gate = module.ranks["gate"]
    shrink = QuantizedMatrix.of(floats["gate_up_u_t"], how, hessian=gram)
    u_hat = _restored(shrink)
    quantized = {"gate_up_u_t": shrink}
    for name, part in (("gate_v_t", slice(0, r_gate)), ("up_v_t", slice(r_gate, None))):
        quantized[name] = _refit(u_hat[:, part], floats["gate_up_u_t"][:, part], floats[name], gram, how)

    def intermediate(x, factors):
        strip = x @ factors["gate_up_u_t"]
        gate = strip[:, :r_gate] @ factors["gate_v_t"]
        return activate(gate, module.activation) * (strip[:, r_gate:] @ factors["up_v_t"])

    stored = {name: _restored(matrix) for name, matrix in quantized.items()}
    down_u = QuantizedMatrix.of(floats["down_u_t"], how, hessian=_gram(intermediate(x, stored) for x in xs))
    d_hat = _restored(down_u)
    zz = torch.zeros(d_hat.shape[1], d_hat.shape[1], dtype=torch.float64, device=d_hat.device)
    zy = torch.zeros(d_hat.shape[1], floats["down_v_t"].shape[1], dtype=torch.float64, device=d_hat.device)
    for x, reference in zip(xs, references, strict=True):  # the intermediate again, a batch at a time
        z = intermediate(x, stored) @ d_hat
        accumulate_gram(zz, z)
        accumulate_product(zy, z, reference)
    return {**quantized, "down_u_t": down_u, "down_v_t": _solve_and_round(zz, zy, how)}


def _refit(u_hat, u, v, gram, how) -> QuantizedMatrix:
    """``V`` refit so that ``x û V' ≈ x u V`` over the inputs whose Gram is ``gram``, then rounded."""
    u_hat, u, v = u_hat.double(), u.double(), v.double()
    cross = u_hat.T @ gram
    return _solve_and_round(cross @ u_hat, cross @ u @ v, how)


def _solve_and_round(zz: torch.Tensor, zy: torch.Tensor, how: Scheme) -> QuantizedMatrix:
    """``V' = argmin Σ‖z V' − y‖²`` from the Grams ``zz = Σ zᵀz``, ``zy = Σ zᵀy``, rounded by GPTQ with
    ``zz`` (the Gram of its inputs ``z``)."""
    damped = zz + _RIDGE * torch.diagonal(zz).mean() * torch.eye(
        zz.shape[0], dtype=zz.dtype, device=zz.device
    )
    return QuantizedMatrix.of(torch.linalg.solve(damped, zy).float(), how, hessian=zz)


def _gram(xs) -> torch.Tensor:
    total = None
    for x in xs:
        if total is None:
            total = torch.zeros(x.shape[-1], x.shape[-1], dtype=torch.float64, device=x.device)
        accumulate_gram(total, x)
    return total


def _restored(matrix: QuantizedMatrix) -> torch.Tensor:
    """The float32 ``(K, N)`` factor that a quantized one stands for."""
    return matrix.dequantized().T


def _relative_error(module, quantized, xs, references) -> float:
    """``‖y_q − y‖ / ‖y‖`` over the batches, ``y`` the float module's outputs on them."""
    restored = {name: _restored(matrix) for name, matrix in quantized.items()}
    error = norm = 0.0
    for x, reference in zip(xs, references, strict=True):
        error += float((_forward(module, restored, x) - reference).double().square().sum())
        norm += float(reference.double().square().sum())
    return (error / max(norm, 1e-300)) ** 0.5


def _forward(module, factors, x):
    if isinstance(module, lowrank.LowRankLinear):
        return torch_ref.lowrank_linear(x, factors["u_t"], factors["v_t"])
    return torch_ref.lowrank_gated_mlp(x, *GatedFactors(**factors), module.activation)
