"""The compression configuration: one frozen, validated object written into every checkpoint."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

FORMAT_VERSION = 1
METHODS = ("whiten", "svd")
ALLOCATIONS = ("uniform", "budget")
HEALS = ("none", "closed-form")
PROJECTIONS = ("gate", "up", "down")


@dataclass(frozen=True)
class CalibrationSpec:
    """Which text, and how many token windows of which length, feed the activation statistics.

    ``source`` is ``"shakespeare"`` (the built-in public-domain plays, disjoint from the held-out
    evaluation plays) or a path to a UTF-8 text file.
    """

    source: str = "shakespeare"
    num_samples: int = 32
    seq_len: int = 512

    def __post_init__(self) -> None:
        if not self.source:
            raise ValueError("calibration source must be 'shakespeare' or a text file path")
        if self.num_samples < 1:
            raise ValueError(f"calibration num_samples must be >= 1, got {self.num_samples}")
        if self.seq_len < 2:
            raise ValueError(f"calibration seq_len must be >= 2, got {self.seq_len}")


@dataclass(frozen=True)
class CompressConfig:
    """How to compress a model's MLPs.

    Attributes:
        keep: fraction of each MLP matrix's parameters kept, in (0, 1]. The NeuronMLP paper's
            "compression ratio" is ``1 - keep``.
        align: ranks are multiples of this (tensor cores want 16; the paper used 128).
        method: ``"whiten"`` (activation-aware SVD on calibration data) or ``"svd"`` (plain SVD).
        calibration: the calibration text and token budget (unused by ``"svd"``).
        seed: seeds the choice of calibration windows.
        targets: which projections of each MLP to factorise.
        layers: indices of decoder layers to compress; ``None`` means all of them.
        allocation: ``"uniform"`` (every matrix at the rank rule's rank for ``keep``) or
            ``"budget"`` (ranks allocated across all matrices from their spectra so that together
            they keep ``keep`` of the parameters; see :mod:`svdmlp.ranks`).
        sequential: calibrate each layer on the outputs of the already-compressed layers before
            it, so that it compensates their error (see :mod:`svdmlp.sequential`); otherwise every
            layer is calibrated on the dense model's activations.
        heal: ``"none"`` or ``"closed-form"`` (refit each matrix's V by least squares so the
            compressed model reproduces the dense outputs; see :mod:`svdmlp.heal`).
    """

    keep: float = 0.8
    align: int = 32
    method: str = "whiten"
    calibration: CalibrationSpec = field(default_factory=CalibrationSpec)
    seed: int = 0
    targets: tuple[str, ...] = PROJECTIONS
    layers: tuple[int, ...] | None = None
    allocation: str = "uniform"
    sequential: bool = False
    heal: str = "none"

    def __post_init__(self) -> None:
        if isinstance(self.keep, bool) or not isinstance(self.keep, (int, float)):
            raise TypeError(f"keep must be a number, got {type(self.keep).__name__}")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1] (fraction of parameters kept), got {self.keep}")
        if not isinstance(self.align, int) or self.align < 1:
            raise ValueError(f"align must be an integer >= 1, got {self.align!r}")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; expected one of {METHODS}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"unknown allocation {self.allocation!r}; expected one of {ALLOCATIONS}")
        if not isinstance(self.sequential, bool):
            raise ValueError(f"sequential must be true or false, got {self.sequential!r}")
        if self.heal not in HEALS:
            raise ValueError(f"unknown heal {self.heal!r}; expected one of {HEALS}")
        if self.method != "whiten" and (self.sequential or self.heal != "none"):
            # Both act on calibration activations, which plain SVD never collects.
            raise ValueError(
                f"sequential and heal need method 'whiten', got method {self.method!r} "
                f"with sequential={self.sequential}, heal={self.heal!r}"
            )
        targets = tuple(self.targets)
        unknown = sorted(set(targets) - set(PROJECTIONS))
        if unknown or not targets or len(set(targets)) != len(targets):
            raise ValueError(f"targets must be distinct names from {PROJECTIONS}, got {targets}")
        object.__setattr__(self, "targets", tuple(p for p in PROJECTIONS if p in targets))
        if self.layers is not None:
            layers = tuple(self.layers)
            if not layers or any(not isinstance(i, int) or i < 0 for i in layers):
                raise ValueError(f"layers must be a non-empty list of indices >= 0, got {layers}")
            object.__setattr__(self, "layers", tuple(sorted(set(layers))))

    @property
    def needs_calibration(self) -> bool:
        return self.method == "whiten"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["targets"] = list(self.targets)
        data["layers"] = None if self.layers is None else list(self.layers)
        return {"format_version": FORMAT_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict) -> CompressConfig:
        """Rebuild a config written by :meth:`to_dict`; unknown keys or versions are errors."""
        data = dict(data)
        version = data.pop("format_version", None)
        if version != FORMAT_VERSION:
            raise ValueError(
                f"unsupported config format_version {version!r}; this svdmlp reads {FORMAT_VERSION}"
            )
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; allowed: {sorted(allowed)}")
        calibration = CalibrationSpec(**data.pop("calibration", {}))
        for key in ("targets", "layers"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(calibration=calibration, **data)
