"""Low-rank replacements for a projection and for a whole gated MLP, and swapping them into a model.

Factors are stored in the layout the kernels want (see :mod:`svdmlp.backends.torch_ref`):
``u_t (in, r)`` and ``v_t (r, out)``, so that no transpose happens at run time. The forward pass
dispatches to the backend named by the module's ``backend`` attribute ("torch" or "triton"),
set by :func:`set_backend`. Modules are replaced per instance, by name; classes are never patched.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from svdmlp import arch, backends
from svdmlp.decompose import Factors
from svdmlp.factor_layout import FACTORS, GatedFactors
from svdmlp.int_weights import QuantizedMatrix, Scheme, stored_bytes


def _empty(rows: int, cols: int, dtype: torch.dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(rows, cols, dtype=dtype, device=device), requires_grad=False)


class _Factored(nn.Module):
    """What both low-rank modules share: their factors, float parameters or quantized matrices."""

    FACTORS: tuple[str, ...] = ()
    scheme: Scheme | None = None

    @torch.no_grad()
    def quantize_factors(self, how: Scheme, fill: bool = True) -> dict[str, float]:
        """Replace every factor by a :class:`~svdmlp.int_weights.QuantizedMatrix` of it, rounded to
        nearest (``fill`` False: an empty one of its shape, the skeleton a checkpoint load fills). Both
        backends read them: the PyTorch chain multiplies each by its own kernel (torch's int8/int4 ones
        on CPU), Triton's fused gated MLP reads them as stored at decode. Returns each factor's
        relative error (Frobenius norm), empty when not filled."""
        self._check_float()
        errors, quantized = {}, {}
        for name in self.FACTORS:
            factor = getattr(self, name)
            if fill:
                quantized[name] = QuantizedMatrix.of(factor.detach(), how)
                restored = quantized[name].dequantized().T
                errors[name] = float(
                    (restored - factor.float()).norm() / factor.float().norm().clamp_min(1e-30)
                )
            else:
                quantized[name] = QuantizedMatrix(factor.shape[0], factor.shape[1], how, device=factor.device)
        self.use_quantized(quantized, how)
        return errors

    def use_quantized(self, quantized: dict[str, QuantizedMatrix], how: Scheme) -> None:
        """Put ``quantized`` (one matrix per factor, quantized by ``how``) in place of the float factors."""
        self._check_float()
        if set(quantized) != set(self.FACTORS):
            raise ValueError(f"expected quantized factors {sorted(self.FACTORS)}, got {sorted(quantized)}")
        for name in self.FACTORS:
            delattr(self, name)
            setattr(self, name, quantized[name])
        self.scheme = how

    def _check_float(self) -> None:
        if self.scheme is not None:
            raise ValueError(f"the factors are already quantized ({self.scheme.name})")

    def factor_bytes(self) -> int:
        """Bytes of the factors as stored: packed with their scales when quantized."""
        return sum(stored_bytes(getattr(self, name)) for name in self.FACTORS)


class LowRankLinear(_Factored):
    """``y = (x @ u_t) @ v_t``: a rank-r stand-in for a bias-free ``nn.Linear(in, out)``."""

    FACTORS = ("u_t", "v_t")

    def __init__(self, in_features: int, out_features: int, rank: int, dtype=torch.float32, device=None):
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.u_t = _empty(in_features, rank, dtype, device)  # (in, r)
        self.v_t = _empty(rank, out_features, dtype, device)  # (r, out)
        self.backend = "torch"

    @torch.no_grad()
    def load_factors(self, factors: Factors) -> None:
        """Copy ``W ≈ v @ u`` into this module's (in, r) / (r, out) layout."""
        self.u_t.copy_(factors.u.T)
        self.v_t.copy_(factors.v.T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return backends.get(self.backend).lowrank_linear(x, self.u_t, self.v_t)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}, backend={self.backend}"


class LowRankGatedMLP(_Factored):
    """``down(act(gate(x)) * up(x))`` with all three projections low-rank.

    Gate and up share one read of ``x``: their shrink factors are concatenated into
    ``gate_up_u_t (hidden, r_gate + r_up)``.
    """

    FACTORS = FACTORS

    def __init__(
        self,
        hidden: int,
        inter: int,
        ranks: dict[str, int],
        activation: str,
        dtype=torch.float32,
        device=None,
    ):
        super().__init__()
        self.hidden, self.inter, self.activation = hidden, inter, activation
        self.ranks = {name: ranks[name] for name in arch.PROJECTIONS}
        self.gate_up_u_t = _empty(hidden, ranks["gate"] + ranks["up"], dtype, device)
        self.gate_v_t = _empty(ranks["gate"], inter, dtype, device)
        self.up_v_t = _empty(ranks["up"], inter, dtype, device)
        self.down_u_t = _empty(inter, ranks["down"], dtype, device)
        self.down_v_t = _empty(ranks["down"], hidden, dtype, device)
        self.backend = "torch"

    @torch.no_grad()
    def load_factors(self, factors: dict[str, Factors]) -> None:
        """Copy the three projections' factors into the fused layout."""
        r_gate = self.ranks["gate"]
        self.gate_up_u_t[:, :r_gate].copy_(factors["gate"].u.T)
        self.gate_up_u_t[:, r_gate:].copy_(factors["up"].u.T)
        self.gate_v_t.copy_(factors["gate"].v.T)
        self.up_v_t.copy_(factors["up"].v.T)
        self.down_u_t.copy_(factors["down"].u.T)
        self.down_v_t.copy_(factors["down"].v.T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return backends.get(self.backend).lowrank_gated_mlp(x, *self.factors(), self.activation)

    def factors(self) -> GatedFactors:
        """The five factors as stored (float parameters or quantized matrices)."""
        return GatedFactors(*(getattr(self, name) for name in self.FACTORS))

    def extra_repr(self) -> str:
        ranks = ", ".join(f"{k}={v}" for k, v in self.ranks.items())
        return f"hidden={self.hidden}, inter={self.inter}, ranks=({ranks}), act={self.activation}, backend={self.backend}"


def factor_names() -> frozenset[str]:
    """The names of the low-rank modules' parameters: in a weights file, the mark of an svdmlp checkpoint."""
    ranks = dict.fromkeys(arch.PROJECTIONS, 1)
    modules = (LowRankLinear(1, 1, 1, device="meta"), LowRankGatedMLP(1, 1, ranks, "silu", device="meta"))
    return frozenset(name for module in modules for name, _ in module.named_parameters())


def lowrank_modules(model: nn.Module) -> list[LowRankLinear | LowRankGatedMLP]:
    """Every low-rank module of ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, (LowRankLinear, LowRankGatedMLP))]


def compressed_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of ``model`` that hold low-rank modules, in order."""
    return [layer for layer in arch.decoder_layers(model, arch.of_model(model)) if lowrank_modules(layer)]


def set_backend(model: nn.Module, name: str = "auto") -> str:
    """Point every low-rank module of ``model`` at a backend; returns the concrete backend chosen.
    Quantized factors run on either: Triton's reads them as stored (a fused gated MLP at decode sizes,
    :func:`svdmlp.kernels.quantized_gated_mlp`; each factor by its own kernel otherwise)."""
    device = next(model.parameters()).device
    concrete = backends.resolve(name, device)
    for module in lowrank_modules(model):
        module.backend = concrete
    return concrete


def install(
    model: nn.Module,
    spec: arch.ArchSpec,
    index: int,
    ranks: dict[str, int],
    dtype: torch.dtype,
    device: torch.device | str,
    factors: dict[str, Factors] | None = None,
) -> None:
    """Swap layer ``index``'s MLP (all three projections) or the named projections for low-rank ones.

    With ``factors`` the new modules are filled from them; without, they stay uninitialised (the
    skeleton that a checkpoint load fills in place, typically on the meta device).
    """
    layer = arch.decoder_layers(model, spec)[index]
    mlp = getattr(layer, spec.mlp)
    if set(ranks) == set(arch.PROJECTIONS):
        gate = getattr(mlp, spec.gate)
        fused = LowRankGatedMLP(gate.in_features, gate.out_features, ranks, spec.activation, dtype, device)
        if factors is not None:
            fused.load_factors(factors)
        setattr(layer, spec.mlp, fused)
        return
    for name, rank in ranks.items():
        dense = getattr(mlp, spec.projection(name))
        lowrank = LowRankLinear(dense.in_features, dense.out_features, rank, dtype, device)
        if factors is not None:
            lowrank.load_factors(factors[name])
        setattr(mlp, spec.projection(name), lowrank)


def install_skeleton(
    model: nn.Module,
    layers: dict[int, dict[str, int]],
    dtype: torch.dtype,
    how: Scheme | None = None,
) -> None:
    """Swap in empty low-rank modules on the meta device for every layer of ``layers`` (its ranks by
    projection; the layers it leaves out stay dense), their factors quantized by ``how`` if given: the
    skeleton a checkpoint's weights fill, whichever loader reads them (svdmlp's or transformers')."""
    spec = arch.of_model(model)
    for index, ranks in sorted(layers.items()):
        install(model, spec, index, ranks, dtype, "meta")
    if how is not None:
        for module in lowrank_modules(model):
            module.quantize_factors(how, fill=False)
