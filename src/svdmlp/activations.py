"""The gate nonlinearities of gated MLPs, in PyTorch: a leaf that the kernels, the backends and the
compression all read (the Triton kernels compute the same functions in :mod:`svdmlp.kernels.common`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# SiLU for SwiGLU (Llama, Mistral, Qwen), GELU with the tanh approximation for GeGLU (Gemma).
ACTIVATIONS = ("silu", "gelu_tanh")


def check_activation(activation: str, where: str = "") -> None:
    """Raise ValueError unless ``activation`` is one of :data:`ACTIVATIONS` (``where`` prefixes the message)."""
    if activation not in ACTIVATIONS:
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}unknown activation {activation!r}; expected one of {ACTIVATIONS}")


def activate(gate: torch.Tensor, activation: str) -> torch.Tensor:
    """The gate nonlinearity of a gated MLP: SiLU (SwiGLU) or tanh-approximated GELU (GeGLU)."""
    check_activation(activation)
    if activation == "silu":
        return F.silu(gate)
    return F.gelu(gate, approximate="tanh")
