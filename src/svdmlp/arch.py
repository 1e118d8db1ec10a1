"""Architecture knowledge as data: where each supported model keeps its MLPs and what they compute,
and the lookups that find them in a loaded model.

Imports no torch at run time (the command line reads :data:`PROJECTIONS` through the config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.nn as nn

# The three projections of a gated MLP, in the order every record lists them.
PROJECTIONS = ("gate", "up", "down")


@dataclass(frozen=True)
class ArchSpec:
    """Where a decoder's gated MLPs live and how they are built.

    Attributes:
        layers: dotted path from the causal-LM model to the list of decoder layers.
        mlp: attribute of a decoder layer holding the MLP.
        gate, up, down: attribute names of the three projections inside the MLP.
        activation: the gate nonlinearity, as named in :mod:`svdmlp.activations`.
        bos: whether the family is trained always to see its BOS token first (Gemma: without it,
            a model generates garbage and scores perplexities of thousands), whatever its tokenizer adds.
    """

    layers: str = "model.layers"
    mlp: str = "mlp"
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    activation: str = "silu"
    bos: bool = False

    def projection(self, name: str) -> str:
        """Attribute name of projection ``name`` ("gate", "up" or "down")."""
        return {"gate": self.gate, "up": self.up, "down": self.down}[name]


SWIGLU = ArchSpec(activation="silu")
GEGLU = ArchSpec(activation="gelu_tanh", bos=True)

ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": SWIGLU,
    "mistral": SWIGLU,
    "qwen2": SWIGLU,
    "qwen3": SWIGLU,
    "gemma": GEGLU,
    "gemma2": GEGLU,
    "gemma3_text": GEGLU,
    "gemma3": ArchSpec(layers="model.language_model.layers", activation="gelu_tanh", bos=True),
}

# The activation each architecture's config must name; anything else would make our MLP compute
# a different function from the model's, so we refuse rather than silently change the model.
_CONFIG_ACTIVATIONS = {"silu": ("silu", "swish"), "gelu_tanh": ("gelu_pytorch_tanh", "gelu_tanh")}


def resolve(model_type: str) -> ArchSpec:
    """The spec for a Hugging Face ``model_type``; a ValueError listing the supported ones otherwise."""
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise ValueError(f"unsupported model type {model_type!r}; svdmlp supports: {supported}") from None


def for_config(config) -> ArchSpec:
    """The spec of a Hugging Face model config; ValueError for an unsupported type, or for a model
    whose configured MLP activation differs from what its architecture implies (our MLP would
    compute another function than the model's)."""
    spec = resolve(config.model_type)
    text = config.get_text_config()
    name = getattr(text, "hidden_activation", None) or getattr(text, "hidden_act", None)
    if name is not None and name not in _CONFIG_ACTIVATIONS[spec.activation]:
        raise ValueError(
            f"model type {text.model_type!r} with activation {name!r} is not supported; "
            f"expected one of {_CONFIG_ACTIVATIONS[spec.activation]}"
        )
    return spec


# How sequences may start, as a user picks it: the model's own convention (auto, :func:`bos_token_id`),
# the BOS token whatever the model (yes), or never (no: the literature's perplexity protocol for
# WikiText-2 comparisons on Llama models).
BOS_MODES = ("auto", "yes", "no")


def bos_token_id(spec: ArchSpec, tokenizer) -> int | None:
    """The token every sequence starts with by the model's own convention, or None for none: the
    family's rule (``spec.bos``), else what its tokenizer's ``add_bos_token`` says (Llama-family
    tokenizers differ: Llama 2 and 3 add one, SmolLM2's does not)."""
    if not (spec.bos or getattr(tokenizer, "add_bos_token", False)):
        return None
    if tokenizer.bos_token_id is None:
        raise ValueError("this model expects a BOS token first, but its tokenizer defines none")
    return tokenizer.bos_token_id


def with_bos(windows, bos: int | None):
    """Token windows ``(n, L)`` with ``bos`` put first, ``(n, L + 1)``; ``windows`` itself for None."""
    if bos is None:
        return windows
    started = windows.new_empty((windows.shape[0], windows.shape[1] + 1))
    started[:, 0] = bos
    started[:, 1:] = windows
    return started


def of_model(model: nn.Module) -> ArchSpec:
    """The spec of a loaded model (ValueError for anything unsupported, see :func:`for_config`)."""
    return for_config(model.config)


def decoder_layers(model: nn.Module, spec: ArchSpec) -> nn.ModuleList:
    """The decoder layers of ``model`` as laid out by ``spec``."""
    module = model
    for part in spec.layers.split("."):
        module = getattr(module, part)
    return module


def mlp_name(spec: ArchSpec, index: int) -> str:
    """Fully qualified module name of decoder layer ``index``'s MLP, e.g. ``model.layers.3.mlp``."""
    return f"{spec.layers}.{index}.{spec.mlp}"


def dense_projection(model: nn.Module, spec: ArchSpec, index: int, name: str) -> nn.Linear:
    """The (still dense) ``nn.Linear`` of projection ``name`` in layer ``index``."""
    mlp = getattr(decoder_layers(model, spec)[index], spec.mlp)
    return getattr(mlp, spec.projection(name))
