"""Backend registry: which implementation runs the low-rank modules' forward.

``torch`` (the reference, any device) is always available. ``triton`` runs the fused kernels on a
CUDA GPU, or the unfused chain for the shapes where that measures faster (:mod:`svdmlp.backends.choice`),
and the fused kernels on CPU under ``TRITON_INTERPRET=1`` (slowly, for tests). ``auto`` picks ``triton`` when
the tensors live on CUDA and Triton imports, ``torch`` otherwise. Asking explicitly for an
unavailable backend is an error that says why.

torch is imported where it is used: the command line reads :data:`BACKENDS` for its ``--help``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class Backend:
    """The two ops a backend provides; signatures as in :mod:`svdmlp.backends.torch_ref`."""

    name: str
    lowrank_linear: Callable[..., torch.Tensor]
    lowrank_gated_mlp: Callable[..., torch.Tensor]


def triton_unavailable_reason(device: torch.device | str) -> str | None:
    """Why the Triton backend cannot run on ``device``, or None when it can."""
    import torch

    try:
        importlib.import_module("triton")
    except ImportError:
        return "Triton is not installed (pip install 'svdmlp[triton]')"
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if torch.device(device).type != "cuda" and not interpreting:
        return f"Triton kernels need a CUDA device (model is on {torch.device(device).type}; set TRITON_INTERPRET=1 to run them slowly on CPU)"
    try:
        importlib.import_module("svdmlp.kernels")
    except ImportError as err:
        return f"the Triton kernels failed to import: {err}"
    return None


def resolve(name: str, device: torch.device | str) -> str:
    """Turn a requested backend name into the concrete one to use on ``device``."""
    import torch

    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")
    if name == "auto":
        if torch.device(device).type == "cuda" and triton_unavailable_reason(device) is None:
            return "triton"
        return "torch"
    if name == "triton":
        reason = triton_unavailable_reason(device)
        if reason is not None:
            raise ValueError(f"backend 'triton' is unavailable: {reason}")
    return name


_LOADED: dict[str, Backend] = {}


def get(name: str) -> Backend:
    """The implementation of a concrete backend (``torch`` or ``triton``), loaded once.

    A plain dict rather than ``functools.cache``: the modules' forward calls this, and torch.compile
    traces a dict lookup silently but warns at every cached function it meets.
    """
    if name not in _LOADED:
        _LOADED[name] = _load(name)
    return _LOADED[name]


def _load(name: str) -> Backend:
    if name == "torch":
        from svdmlp.backends import torch_ref

        return Backend("torch", torch_ref.lowrank_linear, torch_ref.lowrank_gated_mlp)
    if name == "triton":
        from svdmlp.backends import compiled_ops

        return Backend("triton", compiled_ops.lowrank_linear, compiled_ops.lowrank_gated_mlp)
    raise ValueError(f"no concrete backend named {name!r}; expected 'torch' or 'triton'")
