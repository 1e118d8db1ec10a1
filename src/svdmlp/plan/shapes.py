"""MLP shapes of the models the planner and the benchmarks know, or of a local Hugging Face model.

Only the gated MLP's dimensions matter here (gate and up: hidden → intermediate; down: intermediate →
hidden), so a shape is four fields, not a model config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MLPShape:
    """One model's gated MLP: every decoder layer has the same ``hidden × intermediate`` projections."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    model_type: str

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "hidden": self.hidden,
            "intermediate": self.intermediate,
            "layers": self.layers,
            "model_type": self.model_type,
        }


# The six models of the NeuronMLP paper (v4), as its code's run.sh and test shapes name them
# (paper.md §3.3 and §5.1), with their Hugging Face config values.
PAPER_MODELS: tuple[MLPShape, ...] = (
    MLPShape("llama-3.2-1b", 2048, 8192, 16, "llama"),
    MLPShape("llama-3.2-3b", 3072, 8192, 28, "llama"),
    MLPShape("llama-3.1-8b", 4096, 14336, 32, "llama"),
    MLPShape("qwen3-1.7b", 2048, 6144, 28, "qwen3"),
    MLPShape("qwen3-4b", 2560, 9728, 36, "qwen3"),
    MLPShape("qwen3-8b", 4096, 12288, 36, "qwen3"),
)

# Small models: the project's default (SmolLM2-135M-Instruct, design.md §1) and two more that a CPU
# can time in seconds (their Hugging Face config.json values).
SMALL_MODELS: tuple[MLPShape, ...] = (
    MLPShape("smollm2-135m", 576, 1536, 30, "llama"),
    MLPShape("smollm2-360m", 960, 2560, 32, "llama"),
    MLPShape("qwen2.5-0.5b", 896, 4864, 24, "qwen2"),
)

# The built-in models of svdmlp.models not timed by default (their config.json values).
OTHER_MODELS: tuple[MLPShape, ...] = (
    MLPShape("gemma-3-270m", 640, 2048, 18, "gemma3_text"),
    MLPShape("qwen2.5-1.5b", 1536, 8960, 28, "qwen2"),
)

BUILTIN: dict[str, MLPShape] = {shape.name: shape for shape in PAPER_MODELS + SMALL_MODELS + OTHER_MODELS}
# The built-in models of svdmlp.models share these shapes (Qwen2.5-Coder-0.5B is Qwen2.5-0.5B's,
# Qwen2.5-Coder-1.5B Qwen2.5-1.5B's).
ALIASES = {
    "default": "smollm2-135m",
    "smollm2-135m-instruct": "smollm2-135m",
    "qwen2.5-coder-0.5b": "qwen2.5-0.5b",
    "qwen2.5-coder-0.5b-instruct": "qwen2.5-0.5b",
    "qwen2.5-coder-1.5b": "qwen2.5-1.5b",
    "qwen2.5-coder-1.5b-instruct": "qwen2.5-1.5b",
}
# A name that stands for a group of models.
GROUPS = {"paper": tuple(shape.name for shape in PAPER_MODELS)}


def shape_from_config(config: dict, name: str) -> MLPShape:
    """The MLP shape in a Hugging Face ``config.json`` dict."""
    missing = [key for key in ("hidden_size", "intermediate_size", "num_hidden_layers") if key not in config]
    if missing:
        raise ValueError(f"{name}: config.json lacks {', '.join(missing)}; is this a decoder-only LLM?")
    return MLPShape(
        name=name,
        hidden=int(config["hidden_size"]),
        intermediate=int(config["intermediate_size"]),
        layers=int(config["num_hidden_layers"]),
        model_type=str(config.get("model_type", "unknown")),
    )


def resolve_shapes(model: str) -> list[MLPShape]:
    """Shapes for a built-in name, a group name ("paper"), a Hub-style id, or a local model directory.

    A Hub-style id such as ``meta-llama/Llama-3.2-1B`` matches the built-in entry named after its last
    component. A path to a directory (or to a ``config.json``) is read from disk; nothing is downloaded.

    Raises:
        ValueError: for an unknown name or a path without a readable config.json.
    """
    path = Path(model)
    if path.exists():
        config_path = path / "config.json" if path.is_dir() else path
        if not config_path.is_file():
            raise ValueError(f"{model}: no config.json in this directory")
        try:
            config = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{config_path}: cannot read it as JSON ({err})") from None
        return [shape_from_config(config, path.resolve().name if path.is_dir() else path.parent.name)]
    key = model.lower().rsplit("/", 1)[-1]
    key = ALIASES.get(key, key)
    if key in GROUPS:
        return [BUILTIN[name] for name in GROUPS[key]]
    if key in BUILTIN:
        return [BUILTIN[key]]
    known = sorted(BUILTIN) + sorted(ALIASES) + sorted(GROUPS)
    raise ValueError(f"unknown model {model!r}: not a local directory, and not one of {known}")
