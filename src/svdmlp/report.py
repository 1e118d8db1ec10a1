"""What a compression did, per matrix and in total: the record saved as ``svdmlp.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch.nn as nn


@dataclass(frozen=True)
class ProjectionRecord:
    """One factorised matrix: its shape, rank, achieved keep and activation-weighted error.

    With closed-form healing, a down projection's ``heal_error_before``/``heal_error_after`` are
    its relative errors against the dense MLP's output when fed by the compressed gate and up,
    ``‖W·Hᵀ − V·U·H̃ᵀ‖ / ‖W·Hᵀ‖``, without and with the compensating fit (see :mod:`svdmlp.heal`).
    """

    name: str
    in_features: int
    out_features: int
    rank: int
    keep: float
    error: float
    heal_error_before: float | None = None
    heal_error_after: float | None = None


@dataclass(frozen=True)
class LayerRecord:
    """One decoder layer's MLP: compressed (with its projections) or skipped, with the reason."""

    index: int
    module: str
    status: str
    reason: str = ""
    projections: tuple[ProjectionRecord, ...] = ()

    @property
    def ranks(self) -> dict[str, int]:
        return {p.name: p.rank for p in self.projections}


@dataclass
class CompressionReport:
    """Everything ``svdmlp.json`` records besides the config and the file checksums."""

    layers: list[LayerRecord]
    params_before: dict[str, int]
    params_after: dict[str, int]
    seconds: float
    calibration: dict = field(default_factory=dict)
    # "activation-weighted" (‖(W − VU)Xᵀ‖/‖WXᵀ‖ on the calibration data) or, without calibration,
    # "weight-frobenius" (‖W − VU‖/‖W‖).
    error_metric: str = "activation-weighted"
    # Wall seconds per phase ("calibration", "factorisation", "allocation" and "healing" if any); ``seconds`` is their
    # total plus checks.
    timings: dict = field(default_factory=dict)
    # Distillation healing ("lora"): steps, lr, seq_len, tokens and their hash, seconds, validation
    # KL (nats/token, dense -> compressed) before and after; empty without it.
    healing: dict = field(default_factory=dict)
    # Ranks allocated under the budget (--allocate): the probe tokens and their hash, seconds, and per
    # layer the KL measured at the reference rank, the rank chosen and the KL predicted there; empty
    # with uniform ranks.
    allocation: dict = field(default_factory=dict)

    @property
    def achieved_keep(self) -> float:
        """Kept fraction of the MLP parameters of the whole model (skipped layers count as kept)."""
        return self.params_after["mlp"] / self.params_before["mlp"]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["achieved_keep"] = self.achieved_keep
        return data

    @classmethod
    def from_dict(cls, data: dict) -> CompressionReport:
        layers = [
            LayerRecord(
                **{**layer, "projections": tuple(ProjectionRecord(**p) for p in layer["projections"])}
            )
            for layer in data["layers"]
        ]
        return cls(
            layers=layers,
            params_before=data["params_before"],
            params_after=data["params_after"],
            seconds=data["seconds"],
            calibration=data.get("calibration", {}),
            error_metric=data.get("error_metric", "activation-weighted"),
            timings=data.get("timings", {}),
            healing=data.get("healing", {}),
            allocation=data.get("allocation", {}),
        )


def count_parameters(model: nn.Module, mlp_names: list[str]) -> dict[str, int]:
    """Parameters of the whole model (tied tensors once) and of the MLP modules named."""
    total = sum(p.numel() for p in model.parameters())
    modules = dict(model.named_modules())
    mlp = sum(p.numel() for name in mlp_names for p in modules[name].parameters())
    return {"total": total, "mlp": mlp}
