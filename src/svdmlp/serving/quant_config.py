"""The ``quantization_config`` an svdmlp checkpoint's ``config.json`` carries: what transformers and vLLM
need to build the compressed model's skeleton before its weights load.

Both engines read a model's ``quantization_config`` and hand it to the method registered under its
``quant_method``; for ``"svdmlp"`` that is our transformers quantizer
(:mod:`svdmlp.serving.transformers_quantizer`) or our vLLM plugin (:mod:`svdmlp.serving.vllm_plugin`).
The record is data alone (no torch here), written by :func:`of_checkpoint` and read back, validated,
by :func:`parse`::

    {"quant_method": "svdmlp", "format_version": 4, "align": 32, "factor_bits": 16,
     "layers": {"0": {"gate": 320, "up": 320, "down": 288}, "2": {...}}}

``layers`` holds every compressed decoder layer's ranks, by projection; a layer it leaves out stayed
dense (the allocation's choice). A layer with all three projections runs as one low-rank gated MLP; a
layer with some (``--targets``) has those projections low-rank inside the original MLP.
``factor_bits`` 8 or 4 stores the factors quantized (:mod:`svdmlp.int_weights`).

A checkpoint whose MLP weights are stored quantized instead (``svdmlp compress --quantize``, format 5)
names their scheme in ``weights`` (``"int8"``, ``"int4"`` or ``"int4-asym"``): every MLP projection of
every layer is quantized, and ``layers`` holds the ranks of the low-rank corrections beside them (a
layer or projection it leaves out has none), their factors stored as ``factor_bits`` says::

    {"quant_method": "svdmlp", "format_version": 5, "align": 16, "factor_bits": 16, "weights": "int4",
     "layers": {"0": {"gate": 16, "up": 16, "down": 16}, ...}}
"""

from __future__ import annotations

from dataclasses import dataclass

QUANT_METHOD = "svdmlp"
# The checkpoint format that introduced this record (svdmlp.checkpoint.FORMAT_VERSION 4); a later,
# incompatible record would raise this number, and readers refuse numbers they do not know.
VERSION = 4
QUANTIZED_VERSION = 5  # a record with ``weights``: older readers must refuse it, not build factors
READABLE_VERSIONS = (4, 5)
_PROJECTIONS = ("gate", "up", "down")  # arch.PROJECTIONS, repeated so this module imports nothing
_FACTOR_BITS = (16, 8, 4)
_WEIGHTS = ("int8", "int4", "int4-asym")  # config.STORED_SCHEMES, repeated so this module imports nothing

# transformers reads a config's ``transformers_weights`` as the name of the weights file to load and
# refuses any name that is not a safetensors file, with the name in its message. An svdmlp checkpoint
# sets it to this sentence, so that transformers without svdmlp imported fails at once with an error
# that says what to do, instead of skipping the unknown quant_method and initialising the MLPs at
# random; svdmlp's quantizer clears it before transformers looks for the weights.
WEIGHTS_GUARD = "this is an svdmlp checkpoint: pip install svdmlp, then import svdmlp before loading it"


@dataclass(frozen=True)
class QuantSpec:
    """A parsed ``quantization_config``: each compressed layer's ranks and how the factors are stored."""

    layers: dict[int, dict[str, int]]
    align: int
    factor_bits: int
    version: int = VERSION
    weights: str | None = None  # the MLP weights' scheme when stored quantized; layers: corrections

    def fully_compressed(self, index: int) -> bool:
        """Whether layer ``index``'s whole gated MLP is low-rank (not only some projections)."""
        return set(self.layers.get(index, ())) == set(_PROJECTIONS)

    def require_whole_mlps(self) -> None:
        """A ValueError unless every compressed layer's MLP is low-rank whole (or, with quantized
        weights, every corrected layer corrected whole): what vLLM can serve (its MLP is one merged
        gate/up layer and one down layer, each low-rank or dense as a whole)."""
        partial = [index for index in self.layers if not self.fully_compressed(index)]
        if partial and self.weights is not None:
            raise ValueError(
                f"the checkpoint corrects only some projections of layer {partial[0]}; vLLM serves "
                "quantized MLPs whose corrections cover gate, up and down alike"
            )
        if partial:
            raise ValueError(
                f"the checkpoint has only some projections of layer {partial[0]} low-rank (--targets); "
                "vLLM serves checkpoints whose compressed MLPs are low-rank whole"
            )

    def to_dict(self) -> dict:
        return {
            "quant_method": QUANT_METHOD,
            "format_version": self.version,
            "align": self.align,
            "factor_bits": self.factor_bits,
            **({"weights": self.weights} if self.weights is not None else {}),
            "layers": {str(index): dict(ranks) for index, ranks in sorted(self.layers.items())},
        }


def of_checkpoint(report: dict, config: dict) -> QuantSpec:
    """The spec of a checkpoint from its compression report and config, as ``svdmlp.json`` holds them."""
    weights = config.get("quantize")
    layers = {
        layer["index"]: {p["name"]: p["rank"] for p in layer["projections"]}
        for layer in report["layers"]
        if layer["status"] in ("compressed", "quantized") and layer["projections"]
    }
    return QuantSpec(
        layers=layers,
        align=config.get("align", 1),
        factor_bits=config.get("factor_bits", 16),
        version=VERSION if weights is None else QUANTIZED_VERSION,
        weights=weights,
    )


def parse(record) -> QuantSpec:
    """The :class:`QuantSpec` of a ``quantization_config`` (a dict, or an object with ``to_dict``); a
    ValueError that says what is wrong for anything this svdmlp cannot build a model from."""
    if hasattr(record, "to_dict"):
        record = record.to_dict()
    if not isinstance(record, dict) or record.get("quant_method") != QUANT_METHOD:
        raise ValueError(f"not an svdmlp quantization_config: {record!r:.200}")
    version = record.get("format_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise ValueError(
            f"the checkpoint's svdmlp quantization_config has format_version {version!r}; this svdmlp "
            f"reads {' or '.join(map(str, READABLE_VERSIONS))} (upgrade svdmlp for a newer checkpoint)"
        )
    bits, align, layers = record.get("factor_bits"), record.get("align"), record.get("layers")
    weights = record.get("weights")
    if (weights is not None) != (version == QUANTIZED_VERSION) or weights not in (None, *_WEIGHTS):
        raise ValueError(
            f"svdmlp quantization_config: weights must be one of {_WEIGHTS} in format_version "
            f"{QUANTIZED_VERSION} and absent before, got {weights!r} in {version}"
        )
    if bits not in _FACTOR_BITS or type(bits) is not int:
        raise ValueError(
            f"svdmlp quantization_config: factor_bits must be one of {_FACTOR_BITS}, got {bits!r}"
        )
    if type(align) is not int or align < 1:
        raise ValueError(f"svdmlp quantization_config: align must be an integer >= 1, got {align!r}")
    if not isinstance(layers, dict):
        raise ValueError("svdmlp quantization_config: layers must map layer indices to ranks")
    parsed = {}
    for key, ranks in layers.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(f"svdmlp quantization_config: layer {key!r} is not a layer index")
        if not (
            isinstance(ranks, dict)
            and ranks
            and set(ranks) <= set(_PROJECTIONS)
            and all(type(r) is int and r >= 1 for r in ranks.values())
        ):
            raise ValueError(
                f"svdmlp quantization_config: layer {key}'s ranks must map some of {_PROJECTIONS} to "
                f"positive integers, got {ranks!r:.200}"
            )
        parsed[int(key)] = {name: ranks[name] for name in _PROJECTIONS if name in ranks}
    return QuantSpec(layers=parsed, align=align, factor_bits=bits, version=version, weights=weights)
