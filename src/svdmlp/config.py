"""The compression configuration: one frozen, validated object written into every checkpoint."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from svdmlp import corpora
from svdmlp.arch import PROJECTIONS
from svdmlp.ranks import check_keep

# --factor-bits: the quantization scheme (svdmlp.int_weights) the factors are stored in; 16 keeps them
# in the model's floating-point dtype.
FACTOR_BITS = {16: None, 8: "int8", 4: "int4"}
# What a checkpoint's quantized weights (``quantize``) are stored in: svdmlp.int_weights.STORED's names
# (repeated here, where torch is not imported; a test keeps the two equal).
STORED_SCHEMES = ("int8", "int4", "int4-asym")

# The calibration windows hold about this many tokens per unit of the MLP's intermediate width. The
# Grams being estimated are that wide, and an estimate's error falls with its samples per dimension:
# on Qwen2.5-Coder-0.5B at keep 0.8, 3.4 tokens per width (32 windows) scored x1.215 of dense over the
# five domains (python x1.40), 6.7 (64 windows) x1.177 (python x1.32), 13.5 (128 windows) x1.150
# (python x1.25, the unseen licences x3.54 -> x2.97) (docs/results/sizes).
CALIB_TOKENS_PER_WIDTH = 12

FORMAT_VERSION = 1
# The smallest keep accepted: below it the rank rule's floor (one block of ``align`` per matrix) keeps
# far more than was asked for (keep 1e-9 achieved 0.076 on SmolLM2-135M), and the number misleads.
MIN_KEEP = 0.01
METHODS = ("whiten", "fisher", "svd")
ALLOCATIONS = ("uniform", "budget")
HEALS = ("none", "closed-form", "lora", "closed-form+lora")
RECIPE_OPTIONS = ("sequential", "allocate", "closed-form", "lora")


def checked_keep(keep: float) -> float:
    """``keep`` itself if it is a number in [MIN_KEEP, 1] (:func:`~svdmlp.ranks.check_keep`
    and the floor above); TypeError or ValueError naming it otherwise."""
    check_keep(keep)
    if keep < MIN_KEEP:
        raise ValueError(
            f"keep {keep:g} is below {MIN_KEEP}: the ranks cannot go under one block of --align per matrix, "
            "so far more would be kept than asked for"
        )
    return keep


@dataclass(frozen=True)
class Effort:
    """A named compression budget: the recipe and token budgets ``svdmlp compress --effort NAME`` uses
    for every option not given explicitly. Times are SmolLM2-135M's on 2 CPU cores (BENCHMARKS.md)."""

    method: str
    allocation: str
    sequential: bool
    heal: str
    calib_samples: int  # the fewest calibration windows; a wide MLP gets more (calibration_windows)
    heal_steps: int
    about: str

    def calibration_windows(self, inter: int, seq_len: int) -> int:
        """The calibration windows for an MLP ``inter`` wide: about :data:`CALIB_TOKENS_PER_WIDTH`
        tokens per width, to the nearest whole multiple of ``calib_samples`` (so that the counts
        measured are the defaults: SmolLM2-135M and Gemma-3-270M 32, Qwen2.5-Coder-0.5B 128)."""
        per_window = seq_len + 1  # a window's tokens, as the calibration draws them
        wanted = CALIB_TOKENS_PER_WIDTH * inter / (self.calib_samples * per_window)
        return self.calib_samples * max(1, math.floor(wanted + 0.5))

    @property
    def recipe(self) -> str:
        """This effort's method and options as a recipe of :meth:`CompressConfig.with_recipe`."""
        options = ["allocate"] * (self.allocation == "budget") + ["sequential"] * self.sequential
        options += [part for part in self.heal.split("+") if part != "none"]
        return "+".join([self.method, *options])


EFFORTS = {
    "fast": Effort(
        "fisher",
        "uniform",
        False,
        "none",
        32,
        48,
        "one-shot output-aware SVD: 5.6 minutes for SmolLM2-135M on 2 cores (measured in memory)",
    ),
    "default": Effort(
        "fisher",
        "budget",
        True,
        "closed-form+lora",
        32,
        16,
        "allocation, sequential calibration on 32 windows (more for a wide MLP), closed-form and 16 "
        "distillation steps: 9.5 minutes and 3.3 GB for SmolLM2-135M on 2 cores, x1.35 of dense perplexity "
        "over the five domains (Qwen2.5-Coder-0.5B on 128 windows: 102 minutes, x1.15)",
    ),
    "thorough": Effort(
        "fisher",
        "budget",
        True,
        "closed-form+lora",
        32,
        64,
        "the default recipe with four times the distillation (64 steps): 15.5 minutes for SmolLM2-135M on "
        "2 cores, x1.31 of dense perplexity over the five domains against the default's x1.35 "
        "(Qwen2.5-Coder-0.5B on 64 windows: 112 minutes, x1.15)",
    ),
}


def parse_mixture(source: str) -> tuple[tuple[str, float], ...]:
    """``"a.txt:3,shakespeare:1"`` -> ``(("a.txt", 0.75), ("shakespeare", 0.25))``: weights normalised.

    A part without ``:WEIGHT`` weighs 1. Only a numeric suffix is a weight, so a path that contains
    a colon elsewhere still works. ``general`` stands for every built-in domain's calibration source
    at equal weights (its weight shared among them).
    """
    parts = [part.strip() for part in source.split(",")]
    if not source.strip() or not all(parts):
        raise ValueError(f"calibration source must be NAME[:WEIGHT][,NAME[:WEIGHT]...], got {source!r}")
    named = []
    for part in parts:
        name, _, suffix = part.rpartition(":")
        try:
            weight = float(suffix) if name else 1.0
        except ValueError:
            name, weight = part, 1.0
        name = name or part
        if not weight > 0 or weight == float("inf"):
            raise ValueError(f"calibration weight of {name!r} must be a positive number, got {suffix!r}")
        if name == corpora.GENERAL:
            named += [
                (domain, weight / len(corpora.CALIBRATION_SOURCES)) for domain in corpora.CALIBRATION_SOURCES
            ]
        else:
            named.append((name, weight))
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise ValueError(
            f"calibration source lists a text twice (general holds {corpora.CALIBRATION_SOURCES}): {source!r}"
        )
    total = sum(weight for _, weight in named)
    return tuple((name, weight / total) for name, weight in named)


@dataclass(frozen=True)
class CalibrationSpec:
    """Which text, and how many token windows of which length, feed the activation statistics.

    ``source`` is a built-in calibration source (see :mod:`svdmlp.corpora`: ``shakespeare``,
    ``gsm8k``, ``python``, ``prose``, ``chat``; each disjoint from its ``-heldout`` evaluation part),
    ``general`` (all five, equal weights: the default), ``languages`` and ``web`` (text beyond the
    domains, :mod:`svdmlp.corpora.varied`), ``self`` (the dense model's own samples), a
    path to a UTF-8 text file, or a weighted mixture of those, ``"NAME[:WEIGHT],NAME[:WEIGHT]"``: each
    text gets its weight's share of the windows.
    """

    source: str = corpora.GENERAL
    num_samples: int = 32
    seq_len: int = 512

    def __post_init__(self) -> None:
        mixture = parse_mixture(self.source)
        if self.num_samples < 1:
            raise ValueError(f"calibration num_samples must be >= 1, got {self.num_samples}")
        if self.num_samples < len(mixture):
            raise ValueError(
                f"calibration num_samples ({self.num_samples}) must be at least the number of texts "
                f"in the mixture ({len(mixture)})"
            )
        if self.seq_len < 2:
            raise ValueError(f"calibration seq_len must be >= 2, got {self.seq_len}")

    @property
    def mixture(self) -> tuple[tuple[str, float], ...]:
        """``(source, weight)`` pairs, weights summing to 1."""
        return parse_mixture(self.source)


@dataclass(frozen=True)
class LoraSpec:
    """Healing by distillation (``heal="lora"``): how long and how hard to train the factors.

    Each step trains on one window of ``seq_len`` calibration tokens (drawn from the calibration
    source with its own seed), with AdamW, a short warm-up and a linear decay to zero. Each factor's
    peak learning rate is ``relative_lr`` times its RMS (Adafactor's relative step): AdamW moves every
    element by about its learning rate whatever the gradient's scale, so a fixed rate is a large step
    for small factors and a small one for large factors. Output-aware factors are far apart in scale:
    Qwen2.5-Coder-0.5B's U factors have an RMS near 0.003 and its V factors near 0.2, and one rate of
    3e-5 for all made its validation KL rise (BENCHMARKS.md). ``lr`` sets one fixed peak rate instead.
    """

    steps: int = 48
    lr: float | None = None
    seq_len: int = 512
    relative_lr: float = 3e-4

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"lora steps must be an integer >= 1, got {self.steps!r}")
        rates = {"relative_lr": self.relative_lr, **({} if self.lr is None else {"lr": self.lr})}
        for name, value in rates.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ValueError(f"lora {name} must be in (0, 1), got {value!r}")
        if self.seq_len < 2:
            raise ValueError(f"lora seq_len must be >= 2, got {self.seq_len}")


@dataclass(frozen=True)
class CompressConfig:
    """How to compress a model's MLPs.

    Attributes:
        keep: fraction of each MLP matrix's parameters kept, in (0, 1]. The NeuronMLP paper's
            "compression ratio" is ``1 - keep``.
        align: ranks are multiples of this (tensor cores want 16; the paper used 128).
        method: ``"whiten"`` (activation-aware SVD on calibration data), ``"fisher"`` (the same,
            the error also weighted by the dense model's output-gradient Fisher Gram of each
            projection: the loss increase to second order, see
            :mod:`svdmlp.compression.output_grams`) or ``"svd"`` (plain SVD).
        calibration: the calibration text and token budget (unused by ``"svd"``).
        seed: seeds the choice of calibration windows.
        targets: which projections of each MLP to factorise.
        layers: indices of decoder layers to compress; ``None`` means all of them.
        allocation: ``"uniform"`` (every matrix at the rank rule's rank for ``keep``) or
            ``"budget"`` (one rank per layer, allocated from each layer's measured sensitivity so
            that together they keep ``keep`` of the parameters; see :mod:`svdmlp.ranks`).
        sequential: calibrate each layer on the outputs of the already-compressed layers before
            it, so that it compensates their error (see :mod:`svdmlp.compression.sequential`); otherwise every
            layer is calibrated on the dense model's activations.
        heal: ``"none"``; ``"closed-form"`` (needs ``sequential``: each down projection is fitted
            by reduced-rank regression so that, fed by the compressed gate and up, it reproduces the
            dense MLP's output; see :mod:`svdmlp.compression.heal.closed_form`); or ``"lora"`` (after factorising, train the
            low-rank factors to match the dense model's next-token distribution on calibration
            text; see :mod:`svdmlp.compression.heal.distill`); or ``"closed-form+lora"``, both in that order.
        lora: steps, learning rates and window length of ``heal="lora"``.
        factor_bits: 16 keeps the factors in floating point; 8 or 4 stores them quantized after
            healing (int8 per output channel, int4 in groups of 128: :mod:`svdmlp.int_weights`); with
            ``quantize``, the width the correction's factors are stored in.
        quantize: instead of factorising, store every MLP weight quantized by this scheme (one of
            :data:`STORED_SCHEMES`), rounded by GPTQ on the calibration windows layer by layer (each layer
            calibrated on the outputs of the layers already rounded):
            :mod:`svdmlp.compression.quantized_dense`. The recipe's other fields do not apply.
        correction_keep: with ``quantize``, beside each quantized weight a low-rank correction of its
            rounding error keeping this fraction of its parameters (the rank rule of ``keep``, aligned
            to ``align``; :mod:`svdmlp.compression.correction`); 0: none.
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
    lora: LoraSpec = field(default_factory=LoraSpec)
    factor_bits: int = 16
    quantize: str | None = None
    correction_keep: float = 0.0

    def __post_init__(self) -> None:
        checked_keep(self.keep)
        self._check_quantize()
        if self.factor_bits not in FACTOR_BITS:
            raise ValueError(f"factor bits must be one of {sorted(FACTOR_BITS)}, got {self.factor_bits!r}")
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
        if not self.needs_calibration and self.sequential:
            # It acts on calibration activations, which plain SVD never collects.
            raise ValueError(f"sequential needs method 'whiten' or 'fisher', got method {self.method!r}")
        if self.heals_closed_form and not self.sequential:
            # The refit needs the MLP's inputs themselves (the compressed gate/up outputs are a
            # nonlinear function of them), which only the layer-by-layer pass keeps.
            raise ValueError(f"heal {self.heal!r} needs sequential calibration (--sequential)")
        if self.heals_lora and self.lora.steps < len(self.calibration.mixture):
            raise ValueError(
                f"lora steps ({self.lora.steps}) must be at least the number of calibration texts "
                f"({len(self.calibration.mixture)}): each step trains on one window"
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

    def _check_quantize(self) -> None:
        if self.quantize is not None and self.quantize not in STORED_SCHEMES:
            raise ValueError(
                f"quantize must be one of {', '.join(STORED_SCHEMES)} (the schemes a checkpoint stores and "
                f"runs packed), got {self.quantize!r}; svdmlp eval --quantize scores any intB[gG][-asym]"
            )
        correction = self.correction_keep
        if (
            isinstance(correction, bool)
            or not isinstance(correction, (int, float))
            or not 0 <= correction < 1
        ):
            raise ValueError(f"the correction's keep must be in [0, 1), got {correction!r}")
        if correction and self.quantize is None:
            raise ValueError("a correction (correction_keep) corrects quantized weights: give quantize too")
        if self.quantize is not None and self.factor_bits != 16 and not correction:
            raise ValueError(
                "with quantize, factor_bits is the width of the correction's factors: give correction_keep"
            )

    @property
    def heals_closed_form(self) -> bool:
        return "closed-form" in self.heal.split("+")

    @property
    def heals_lora(self) -> bool:
        return "lora" in self.heal.split("+")

    @property
    def needs_calibration(self) -> bool:
        return self.method in ("whiten", "fisher")

    @property
    def needs_output_grams(self) -> bool:
        """Whether the dense model's output-gradient Grams weight the factorisation."""
        return self.method == "fisher"

    @property
    def needs_dense_grams(self) -> bool:
        """Whether the dense model's Grams are used: one-shot factorising, or ranks allocated from them."""
        return self.needs_calibration and (not self.sequential or self.allocation == "budget")

    @classmethod
    def preset(
        cls, effort: str = "default", *, keep: float = 0.8, inter: int | None = None, **changes
    ) -> CompressConfig:
        """The recipe and budgets of ``effort`` (one of :data:`EFFORTS`: what ``svdmlp compress --effort``
        uses) at ``keep``, any other field set by ``changes``. ``inter``, the MLP's intermediate width,
        sizes the calibration windows as the command line does (None: the effort's fewest). Plain SVD
        (``method="svd"``) collects no calibration, so the effort's sequential calibration and
        closed-form healing, which need it, do not apply to it unless asked for."""
        if effort not in EFFORTS:
            raise ValueError(f"unknown effort {effort!r}; expected one of {sorted(EFFORTS)}")
        preset = EFFORTS[effort]
        calibrated = changes.get("method", preset.method) != "svd"
        seq_len = CalibrationSpec.seq_len
        samples = preset.calib_samples if inter is None else preset.calibration_windows(inter, seq_len)
        distils = "lora" in preset.heal.split("+")
        defaults = {
            "keep": keep,
            "method": preset.method,
            "calibration": CalibrationSpec(num_samples=samples),
            "allocation": preset.allocation,
            "sequential": preset.sequential and calibrated,
            "heal": preset.heal if calibrated else ("lora" if distils else "none"),
            "lora": LoraSpec(steps=preset.heal_steps),
        }
        return cls(**{**defaults, **changes})

    def with_recipe(self, recipe: str) -> CompressConfig:
        """This config with a recipe's method and options, e.g. ``"whiten+sequential+closed-form+lora"``.

        A recipe is ``METHOD[+OPTION...]`` with options from :data:`RECIPE_OPTIONS` in any order,
        each at most once: how the sweep names the variants it compares at equal parameters.
        """
        method, *options = recipe.split("+")
        unknown = sorted(set(options) - set(RECIPE_OPTIONS))
        if unknown or len(set(options)) != len(options):
            raise ValueError(
                f"recipe {recipe!r} must be METHOD[+OPTION...] with distinct options from {RECIPE_OPTIONS}"
            )
        heal = "+".join(h for h in ("closed-form", "lora") if h in options) or "none"
        allocation = "budget" if "allocate" in options else "uniform"
        return replace(
            self, method=method, sequential="sequential" in options, allocation=allocation, heal=heal
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["targets"] = list(self.targets)
        data["layers"] = None if self.layers is None else list(self.layers)
        if self.quantize is None:  # written only when set: the records of factorised models are as before
            del data["quantize"], data["correction_keep"]
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
        lora = LoraSpec(**data.pop("lora", {}))
        for key in ("targets", "layers"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(calibration=calibration, lora=lora, **data)
