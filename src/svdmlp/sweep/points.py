"""The points of a sweep: what each is (the dense model, a quantized baseline, or a recipe at a keep and
factor width), where its record is kept once finished, and what its numbers depend on, so that a rerun
reuses a finished point only when they match."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from svdmlp import models
from svdmlp.compression.report import mlp_bytes as report_mlp_bytes
from svdmlp.config import FACTOR_BITS, CompressConfig, LoraSpec
from svdmlp.evaluate import suite
from svdmlp.quantize import Quantization


@dataclass(frozen=True)
class Point:
    """One model of the sweep: ``dense`` (its MLP rounded by ``quantize``, a :class:`Quantization`'s
    spec, for a baseline), or a recipe (see :meth:`CompressConfig.with_recipe`) at a
    keep, its factors stored in ``factor_bits``."""

    method: str
    keep: float = 1.0
    factor_bits: int = 16
    quantize: str | None = None

    @property
    def name(self) -> str:
        if self.method == "dense":
            return "dense" if self.quantize is None else f"dense-{self.quantize}"
        bits = "" if self.factor_bits == 16 else f"-factors-{FACTOR_BITS[self.factor_bits]}"
        return f"{self.method}-keep{self.keep:g}{bits}"

    @property
    def floating(self) -> Point:
        """The point of the same method and keep with floating-point factors."""
        return replace(self, factor_bits=16)


def plan(
    keeps: tuple[float, ...],
    methods: tuple[str, ...],
    quantize: tuple[str, ...] = (),
    factor_bits: tuple[int, ...] = (16,),
) -> list[Point]:
    """The dense reference first, its quantized baselines, then each method over the keeps in the
    order given, each keep at every factor width (floating point first)."""
    if not keeps or not methods or not factor_bits:
        raise ValueError(
            f"a sweep needs at least one keep, method and factor width, got {keeps}, {methods} and {factor_bits}"
        )
    for keep in keeps:
        replace(CompressConfig(), keep=keep)  # the config's own checks name a bad keep
    for method in methods:
        CompressConfig().with_recipe(method)  # names a bad recipe or an impossible combination
    for bits in factor_bits:
        CompressConfig(factor_bits=bits)
    for name in quantize:
        Quantization.parse(name)
    widths = sorted(dict.fromkeys(factor_bits), reverse=True)
    baselines = [Point("dense", quantize=name) for name in dict.fromkeys(quantize)]
    compressed = [
        Point(m, k, b) for m in dict.fromkeys(methods) for k in dict.fromkeys(keeps) for b in widths
    ]
    return [Point("dense"), *baselines, *compressed]


def point_path(out: Path, point: Point) -> Path:
    """Where a sweep into ``out`` keeps ``point``'s record once it is finished (a rerun skips it)."""
    return out / "points" / f"{point.name}.json"


def mlp_bytes(record: dict) -> int | None:
    """The MLP's bytes at a point (:func:`svdmlp.compression.report.mlp_bytes`); None for a dense point
    recorded before sweeps counted them."""
    return report_mlp_bytes(record.get("params", {}).get("mlp"), record.get("quantization"))


def sweep_identity(model_name, names, settings, base: CompressConfig, dtype) -> dict:
    """What every point's numbers depend on, recorded with each point."""
    return {
        "model": models.recorded_name(model_name) if model_name else models.DEFAULT_MODEL,
        "texts": list(names),
        "settings": settings.to_dict(),
        "compress": {k: v for k, v in base.to_dict().items() if k not in ("keep", "method", "factor_bits")},
        "dtype": str(dtype).removeprefix("torch."),
    }


def relevant(identity: dict, point: Point) -> dict:
    """The settings a point's numbers depend on: no compression setting for the dense model (but the
    calibration windows for a GPTQ baseline), and the healing knobs only for a recipe that distils.
    A finished point is reused whenever these match, so a dense point serves any sweep of the same
    texts, and a new healing default leaves the others. Settings added since a point was written count
    at their defaults (``bos``: the model's convention, which is what those points were scored with for
    every model they ran on; distillation's relative rate, which a fixed ``lr`` leaves unused; a
    point's factor bits are in its name, not its sweep's settings)."""
    identity = {**identity, "settings": {**suite.EvalSettings().to_dict(), **identity["settings"]}}
    compress = {k: v for k, v in identity["compress"].items() if k != "factor_bits"}
    if point.method == "dense":
        identity = {k: v for k, v in identity.items() if k != "compress"}
        if point.quantize and Quantization.parse(point.quantize).gptq:
            identity["compress"] = {k: compress[k] for k in ("calibration", "seed")}
        return identity
    if CompressConfig().with_recipe(point.method).heals_lora:
        lora = {**asdict(LoraSpec()), **compress["lora"]}
        if lora["lr"] is not None:  # one fixed rate: the relative one is not used
            lora.pop("relative_lr")
        return {**identity, "compress": {**compress, "lora": lora}}
    return {**identity, "compress": {k: v for k, v in compress.items() if k != "lora"}}


def check_same_sweep(path: Path, found: dict, expected: dict) -> None:
    for key in expected:
        if found.get(key) != expected[key]:
            raise ValueError(
                f"{path} was made with other {key} ({found.get(key)!r}, now {expected[key]!r}): "
                "use another --out, or delete that file to recompute it"
            )
