"""What a compression did, per matrix and in total: the record saved as ``svdmlp.json``, and its
plain-text form (``svdmlp compress`` and ``svdmlp info`` print it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from svdmlp import arch
from svdmlp.config import FACTOR_BITS
from svdmlp.tables import format_table

if TYPE_CHECKING:
    import torch.nn as nn


@dataclass(frozen=True)
class ProjectionRecord:
    """One factorised matrix: its shape, rank, achieved keep and activation-weighted error.

    With closed-form healing, a down projection's ``heal_error_before``/``heal_error_after`` are
    its relative errors against the dense MLP's output when fed by the compressed gate and up,
    ``‖W·Hᵀ − V·U·H̃ᵀ‖ / ‖W·Hᵀ‖``, without and with the compensating fit (see :mod:`svdmlp.compression.heal.closed_form`).
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

    @classmethod
    def from_dict(cls, data: dict) -> LayerRecord:
        """The record :func:`dataclasses.asdict` made a dict of."""
        return cls(**{**data, "projections": tuple(ProjectionRecord(**p) for p in data["projections"])})


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
    # Wall seconds per step ("calibration", "allocation", "factorisation", "healing", "quantization", those
    # that ran), summed over the runs that made it (svdmlp.compression.clock); ``seconds`` is their total.
    timings: dict = field(default_factory=dict)
    # Distillation healing ("lora"): steps, lr, seq_len, tokens and their hash, seconds, validation
    # KL (nats/token, dense -> compressed) before and after; empty without it.
    healing: dict = field(default_factory=dict)
    # Ranks allocated under the budget (--allocate): the probe tokens and their hash, seconds, and per
    # layer the KL measured at the reference rank, the rank chosen and the KL predicted there; empty
    # with uniform ranks.
    allocation: dict = field(default_factory=dict)
    # Factors stored quantized (--factor-bits 8|4): the scheme, the factors' parameters, their bytes
    # before and after, their mean and largest relative errors (Frobenius), seconds; empty when they
    # stay in floating point.
    quantization: dict = field(default_factory=dict)

    @property
    def achieved_keep(self) -> float:
        """Kept fraction of the MLP parameters of the whole model (skipped layers count as kept), from
        the parameters counted in the model: for bias-free MLPs, what
        :func:`svdmlp.ranks.achieved_keep` gives for every matrix and its rank."""
        return self.params_after["mlp"] / self.params_before["mlp"]

    @property
    def stores_quantized_weights(self) -> bool:
        """Whether the MLP weights themselves are stored quantized (``compress --quantize``: nothing
        factorised) rather than a compression's factors."""
        return bool(self.quantization) and "factor_params" not in self.quantization

    @property
    def stored_quantization(self) -> dict:
        """:attr:`quantization` with the MLP's bytes as stored (``mlp_bytes``): the factors packed with
        their scales, the layers the allocation left dense in bf16; empty with floating-point factors."""
        if not self.quantization:
            return {}
        if self.stores_quantized_weights:  # their bytes counted as stored already
            return dict(self.quantization)
        dense = self.params_after["mlp"] - self.quantization["factor_params"]
        return {**self.quantization, "mlp_bytes": self.quantization["factor_bytes"] + 2 * dense}

    def scored_record(self) -> dict:
        """What a compressed model's scores are recorded with (``svdmlp eval``'s rows, a sweep's points):
        its keep and parameters, how long each step took, its calibration, healing and quantization."""
        return {
            "achieved_keep": self.achieved_keep,
            "compress_seconds": self.seconds,
            "timings": self.timings,
            "calibration": self.calibration,
            "params": self.params_after,
            "healing": self.healing,  # distillation's validation KL before and after, reverted or not
            **({"quantization": self.stored_quantization} if self.quantization else {}),
        }

    def to_dict(self) -> dict:
        data = asdict(self)
        data["achieved_keep"] = self.achieved_keep
        return data

    @classmethod
    def from_dict(cls, data: dict) -> CompressionReport:
        layers = [LayerRecord.from_dict(layer) for layer in data["layers"]]
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
            quantization=data.get("quantization", {}),
        )


def mlp_bytes(mlp_params: int | None, quantization: dict | None = None) -> int | None:
    """The MLP's bytes: packed with their scales where quantized (``quantization["mlp_bytes"]``), else
    two per parameter (bf16, as checkpoints are saved); None when neither is known."""
    if quantization:
        return quantization["mlp_bytes"]
    return None if mlp_params is None else 2 * mlp_params


def count_parameters(model: nn.Module, mlp_names: list[str] | None = None) -> dict[str, int]:
    """Parameters of the whole model (tied tensors once) and of the MLP modules named (None: every
    decoder layer's)."""
    if mlp_names is None:
        spec = arch.of_model(model)
        mlp_names = [arch.mlp_name(spec, index) for index in range(len(arch.decoder_layers(model, spec)))]
    total = sum(p.numel() for p in model.parameters())
    modules = dict(model.named_modules())
    mlp = sum(p.numel() for name in mlp_names for p in modules[name].parameters())
    return {"total": total, "mlp": mlp}


def layer_table(report: CompressionReport) -> str:
    """One row per layer; with allocated ranks, also why: the KL the layer alone caused at the
    reference rank, and the KL predicted at the rank it got."""
    allocated = {layer["index"]: layer for layer in report.allocation.get("layers", [])}
    rows = []
    for layer in report.layers:
        if layer.status == "skipped" or not layer.projections:
            status = f"skipped: {layer.reason}" if layer.status == "skipped" else layer.status
            rows.append([layer.index, status, "", "", ""] + [""] * bool(allocated))
            continue
        projections = layer.projections
        row = [
            layer.index,
            "compressed" if layer.status == "compressed" else "quantized, corrected",
            "/".join(str(p.rank) for p in projections),
            "/".join(f"{p.keep:.3f}" for p in projections),
            "/".join(f"{p.error:.3f}" for p in projections),
        ]
        if allocated:
            why = allocated[layer.index]
            row.append(f"{why['kl']:.4f} at rank {why['reference_rank']} -> {why['predicted_kl']:.4f}")
        rows.append(row)
    names = "/".join(p.name for p in next((la.projections for la in report.layers if la.projections), ()))
    header = ["layer", "status", f"rank {names}", "keep", f"error ({report.error_metric})"]
    return format_table(header + ["KL alone (nats/token) -> predicted"] * bool(allocated), rows)


def _rates(healing: dict) -> str:
    """The peak learning rates distillation used, and their rule (reports from before the rule had
    one fixed rate, ``lr``)."""
    if healing.get("lr") is not None:
        return f" at peak lr {healing['lr']:.2g}"
    low, high = healing["peak_lr"]
    return f" at peak lr {low:.2g} to {high:.2g} ({healing['relative_lr']:g} x each factor's RMS)"


def heal_line(report: CompressionReport) -> str:
    """What healing changed, on the calibration data, one line per stage ("" when nothing was healed)."""
    lines = []
    pairs = [
        (p.heal_error_before, p.heal_error_after)
        for layer in report.layers
        for p in layer.projections
        if p.heal_error_before is not None
    ]
    if pairs:
        before, after = (sum(values) / len(pairs) for values in zip(*pairs, strict=True))
        lines.append(
            f"healing (closed-form): mean error of down against the dense MLP output {before:.4f} -> "
            f"{after:.4f} over {len(pairs)} matrices"
        )
    if report.healing:
        h = report.healing
        lines.append(
            f"healing (lora): {h['steps']} steps of {h['seq_len']} tokens in {h['seconds']:.1f} s"
            + _rates(h)
            + f"; validation KL to the dense model {h['kl_before']:.4f} -> {h['kl_after']:.4f} nats/token"
            + ("; it rose, so the factors from before healing were kept" if h.get("reverted") else "")
        )
        if h.get("losses"):
            lines.append("  training KL by step: " + " ".join(f"{loss:.3f}" for loss in h["losses"]))
        by_source = h.get("kl_by_source") or {}
        if len(by_source) > 1:
            lines.append(
                "  per source: "
                + ", ".join(
                    f"{name} {kl['before']:.4f} -> {kl['after']:.4f}" for name, kl in by_source.items()
                )
            )
    return "\n".join(lines)


def quantization_line(report: CompressionReport) -> str:
    """The factors' quantization, what it saved and its error ("" when they stay in floating point)."""
    q = report.quantization
    if not q:
        return ""
    if report.stores_quantized_weights:
        correction = (
            f" and a correction keeping {q['correction_keep']:g} of each weight ({q['correction_params']:,} "
            f"parameters in {FACTOR_BITS[q.get('correction_bits', 16)] or 'bf16'})"
            if q.get("correction_params")
            else ""
        )
        return (
            f"MLP weights stored {q['scheme']} by GPTQ on the calibration windows{correction}: "
            f"{q['mlp_bytes_bf16'] / 1e6:.1f} MB in bf16 -> {q['mlp_bytes'] / 1e6:.1f} MB; largest "
            f"relative weight error {q['max_rel_error']:.4f}"
        )
    line = (
        f"factors stored {q['scheme']}: {2 * q['factor_params'] / 1e6:.1f} MB in bf16 -> "
        f"{q['factor_bytes'] / 1e6:.1f} MB"
    )
    if "output_error_mean" in q:  # calibrated: the modules' output errors, and round to nearest's
        return (
            f"{line}, GPTQ and refit on the calibration windows: relative output error mean "
            f"{q['output_error_mean']:.4f} (round to nearest {q['rtn_error_mean']:.4f}), largest "
            f"{q['output_error_max']:.4f} ({q['rtn_error_max']:.4f})"
        )
    return f"{line}, rounded to nearest: relative weight error mean {q['weight_error_mean']:.4f}, largest {q['weight_error_max']:.4f}"


def summary_line(report: CompressionReport) -> str:
    before, after = report.params_before, report.params_after
    if report.stores_quantized_weights:
        return (
            f"MLP parameters {before['mlp']:,} -> {after['mlp']:,} with the corrections, stored in "
            f"{report.quantization['mlp_bytes'] / 1e6:.1f} MB"
        )
    return (
        f"MLP parameters {before['mlp']:,} -> {after['mlp']:,} (achieved keep {report.achieved_keep:.4f}); "
        f"model {before['total']:,} -> {after['total']:,} ({after['total'] / before['total']:.4f})"
    )
