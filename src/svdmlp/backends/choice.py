"""The Triton backend's ops: the fused kernels, or the unfused low-rank chain where it measures faster.

The launch model (``svdmlp plan --launches``) predicts where fusion wins, but only a measurement on the
device settles it. On the first call of a (device, dtype, factor shapes, activation, token bucket) on
CUDA outside a graph capture, both paths run a few times and the faster is kept for the process, so that
no shape runs slower than the unfused chain (cuBLAS GEMMs): at decode by the device's time (those calls
are replayed from graphs), above by the eager caller's (:func:`_graphed`). Token counts share a bucket: decode
(M ≤ 16), then each power of two. The engine's warm-up runs before it captures a graph, so the choice
is made by then; a first call inside a capture runs the fused path without deciding. Off CUDA (the
interpreter in the tests) the fused path always runs. Quantized factors have a fused path at decode
sizes only (the gated MLP's); elsewhere they take the unfused chain, each factor by its own kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from svdmlp.backends import torch_ref
from svdmlp.factor_layout import GatedFactors
from svdmlp.int_weights import is_quantized
from svdmlp.timing import cuda_median

WARMUP, REPEATS = 2, 5
_CHOICES: dict[tuple, str] = {}


def bucket(tokens: int) -> int:
    """The token bucket a call falls in: one for decode (M ≤ 16), else the power of two at or above M."""
    from svdmlp.kernels.configs import DECODE_MAX_TOKENS  # imports triton: only on the Triton path

    return DECODE_MAX_TOKENS if tokens <= DECODE_MAX_TOKENS else 1 << (tokens - 1).bit_length()


def choices() -> dict[tuple, str]:
    """Every choice made in this process, by key (for benchmark records)."""
    return dict(_CHOICES)


def _seconds(run: Callable[[], object], device_time: bool) -> float:
    """Median seconds of ``run``: the device's time (the stream held while the host queues it) or
    the eager caller's, the host's pace included."""
    return cuda_median(run, REPEATS, WARMUP, hold=device_time)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def choose(key: tuple, paths: dict[str, Callable[[], torch.Tensor]], device_time: bool) -> str:
    """The name of the faster of ``paths`` (the first is the default), measured once per key, by the
    device's time or by the eager caller's (see :func:`_seconds`)."""
    if key not in _CHOICES:
        if _capturing():
            return next(iter(paths))
        times = {name: _seconds(run, device_time) for name, run in paths.items()}
        _CHOICES[key] = min(times, key=times.get)
    return _CHOICES[key]


def _tokens(x: torch.Tensor) -> int:
    return x.numel() // max(1, x.shape[-1])


def _shape(factor) -> tuple:
    """A factor's part of a choice key: its shape, and its scheme when quantized."""
    if is_quantized(factor):
        return (factor.in_features, factor.out_features, factor.scheme.name)
    return factor.shape


def lowrank_gated_mlp(x, gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t, activation):
    """:func:`svdmlp.kernels.lowrank_gated_mlp`, or the unfused chain where that measured faster.

    Quantized factors: :func:`svdmlp.kernels.quantized_gated_mlp` at decode sizes (or the unfused
    chain, as measured); above, the unfused chain, each factor dequantized for the vendor library.
    """
    from svdmlp import kernels
    from svdmlp.kernels.configs import DECODE_MAX_TOKENS

    factors = GatedFactors(gate_up_u_t, gate_v_t, up_v_t, down_u_t, down_v_t)
    fused = kernels.lowrank_gated_mlp
    if is_quantized(gate_up_u_t):
        if _tokens(x) > DECODE_MAX_TOKENS:
            return torch_ref.lowrank_gated_mlp(x, *factors, activation)
        fused = kernels.quantized_gated_mlp
    if x.device.type != "cuda":
        return fused(x, *factors, activation)
    tokens = bucket(_tokens(x))
    key = ("gated_mlp", str(x.device), x.dtype, *(_shape(f) for f in factors), activation, tokens)
    paths = {
        "fused": lambda: fused(x, *factors, activation),
        "unfused": lambda: torch_ref.lowrank_gated_mlp(x, *factors, activation),
    }
    return paths[choose(key, paths, _graphed(tokens))]()


def _graphed(tokens_bucket: int) -> bool:
    """Whether calls of a token bucket (:func:`bucket`) are timed by the device alone: decode calls are
    replayed from CUDA graphs (the engine captures its decode step), where the host's queueing is paid once;
    larger calls (prefill) run eagerly, where a path the host queues slowly is slower whatever its
    kernels take (the first device run: 0.3-0.5 ms to queue the fused MLP, 3 launches; the unfused
    chain queues faster). Timed eagerly at decode, the fused path lost to the unfused one on the host's
    pace and the engine then replayed the slower chain."""
    return tokens_bucket == bucket(1)


def lowrank_linear(x, u_t, v_t):
    """:func:`svdmlp.kernels.lowrank_linear`, or the two torch GEMMs where they measured faster.
    Quantized factors: the two products of the unfused chain, each by its own kernel (svdmlp's Triton
    one at decode sizes on CUDA)."""
    from svdmlp import kernels

    if is_quantized(u_t):
        return torch_ref.lowrank_linear(x, u_t, v_t)
    if x.device.type != "cuda":
        return kernels.lowrank_linear(x, u_t, v_t)
    tokens = bucket(_tokens(x))
    key = ("linear", str(x.device), x.dtype, u_t.shape, v_t.shape, tokens)
    paths = {
        "fused": lambda: kernels.lowrank_linear(x, u_t, v_t),
        "unfused": lambda: torch_ref.lowrank_linear(x, u_t, v_t),
    }
    return paths[choose(key, paths, _graphed(tokens))]()
