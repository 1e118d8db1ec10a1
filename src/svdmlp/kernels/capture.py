"""The kernel launches the public ops make for given shapes, recorded instead of run, with the tiles the
configs pick for a GPU of a given size: what the ahead-of-time compile (:mod:`svdmlp.kernels.aot`) builds
and what the launch model (:mod:`svdmlp.plan.launches`) predicts the time of.

The ops run on meta tensors (nothing is allocated or computed); every Triton launch and every library
GEMM (:func:`svdmlp.kernels.common.library_matmul`) is recorded in order. Works with the real kernels and
under the interpreter alike: the launchers are told they are compiled for the GPU either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from unittest import mock

import torch

from svdmlp.factor_layout import GatedFactors
from svdmlp.kernels import common, configs
from svdmlp.kernels.gated_expand import _gated_expand_kernel
from svdmlp.kernels.gated_mlp import lowrank_gated_mlp
from svdmlp.kernels.lowrank_linear import _lowrank_linear_kernel
from svdmlp.kernels.matmul import _matmul_kernel
from svdmlp.kernels.quantized_gated_expand import _quantized_gated_expand_kernel
from svdmlp.kernels.quantized_gated_mlp import quantized_gated_mlp
from svdmlp.kernels.quantized_matmul import _quantized_matmul_kernel, quantized_matmul

KERNELS = (
    _matmul_kernel,
    _gated_expand_kernel,
    _lowrank_linear_kernel,
    _quantized_matmul_kernel,
    _quantized_gated_expand_kernel,
)
LIBRARY = "library_matmul"  # the name a recorded library GEMM goes by
_LAUNCHERS = (
    "matmul",
    "gated_expand",
    "lowrank_linear",
    "gated_mlp",
    "quantized_matmul",
    "quantized_gated_expand",
    "quantized_gated_mlp",
)


@dataclass(frozen=True)
class Launch:
    """One recorded launch: a Triton kernel with its grid and arguments, or a library GEMM
    (``kernel`` None, ``args`` its operands ``(a, b, out)``)."""

    kernel: object | None
    args: tuple
    constexprs: tuple[tuple[str, object], ...] = ()
    grid: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return LIBRARY if self.kernel is None else self.kernel.fn.__name__

    @property
    def programs(self) -> int:
        count = 1
        for size in self.grid:
            count *= size
        return count

    def arguments(self) -> dict[str, object]:
        """Every argument by its name in the kernel's signature (constexprs and launch options too)."""
        if self.kernel is None:
            return dict(zip(("a", "b", "out"), self.args, strict=True))
        return dict(zip(self.kernel.arg_names, self.args, strict=False)) | dict(self.constexprs)

    def describe(self) -> str:
        if self.kernel is None:
            a, b, _ = self.args
            return f"{LIBRARY}({a.shape[0]}x{a.shape[1]} @ {b.shape[0]}x{b.shape[1]})"
        shown = (
            f"{k}={v}"
            for k, v in self.constexprs
            if k.startswith(
                ("BLOCK", "RANK", "FUSE", "MERGED", "DOWN", "BITS", "ZERO_POINT", "CORRECTION", "num_")
            )
        )
        return f"{self.name}({', '.join(shown)})"


@contextlib.contextmanager
def captured_launches(sms: int) -> Iterator[list[Launch]]:
    """Within this context the public ops record their launches, with the tiles of a GPU of ``sms``
    SMs that has programmatic dependent launch (sm_90), instead of running them."""
    launches: list[Launch] = []

    def recorder(kernel):
        def run(*args, grid=None, warmup=False, **kwargs):
            launches.append(Launch(kernel, args, tuple(sorted(kwargs.items())), tuple(grid)))

        return run

    def library(a, b, out):
        launches.append(Launch(None, (a, b, out)))
        return out

    with contextlib.ExitStack() as stack:
        for kernel in KERNELS:
            stack.enter_context(mock.patch.object(kernel, "run", recorder(kernel)))
        stack.enter_context(mock.patch.object(configs, "sm_count", lambda device: sms))
        stack.enter_context(
            mock.patch.object(configs, "programmatic_launch", lambda device, interpreted: True)
        )
        stack.enter_context(mock.patch.object(common, "library_matmul", library))
        for name in _LAUNCHERS:
            module = f"svdmlp.kernels.{name}"
            for attribute, value in (
                ("is_interpreted", lambda kernel: False),
                ("check_device", lambda *args: None),
                ("device_guard", lambda device: contextlib.nullcontext()),
            ):
                with contextlib.suppress(AttributeError):
                    stack.enter_context(mock.patch(f"{module}.{attribute}", value))
        yield launches


def meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class QuantizedLayout:
    """A quantization scheme as the kernels read it (of :class:`svdmlp.int_weights.Scheme`, a layer above)."""

    bits: int
    group: int | None
    zero_point: bool = False


# How svdmlp.int_weights.SCHEMES store factors: int8 per output channel, int4 in groups of 128.
QUANTIZED_LAYOUTS = (QuantizedLayout(8, None), QuantizedLayout(4, 128))
# How compress --quantize int4-asym stores a dense weight: int4 in groups of 128 with zero points.
ZERO_POINT_LAYOUT = QuantizedLayout(4, 128, zero_point=True)
# The rank of the low-rank correction :func:`corrected_launches` compiles (keep 0.05 of SmolLM2's MLP).
CORRECTION_RANK = 16


def meta_quantized(k: int, n: int, layout: QuantizedLayout) -> SimpleNamespace:
    """A ``(K, N)`` factor stored quantized (:class:`~svdmlp.kernels.dequantize.QuantizedFactor`), on meta."""
    width, dtype = (k, torch.int8) if layout.bits == 8 else (-(-k // 2), torch.uint8)
    groups = 1 if layout.group is None else -(-k // layout.group)
    return SimpleNamespace(
        in_features=k,
        out_features=n,
        values=meta(n, width, dtype=dtype),
        scales=meta(n, groups, dtype=torch.int16),
        scheme=layout,
    )


def gated_mlp_launches(
    hidden: int,
    inter: int,
    ranks: tuple[int, int, int],
    tokens: int,
    dtype: torch.dtype,
    sms: int,
    schedule: str | None = None,
    quantized: QuantizedLayout | None = None,
) -> list[Launch]:
    """The launches of one low-rank gated MLP with (gate, up, down) ``ranks`` at ``tokens`` tokens; with
    ``quantized``, of :func:`~svdmlp.kernels.quantized_gated_mlp` on factors stored so (decode sizes)."""
    r_gate, r_up, r_down = ranks
    shapes = GatedFactors(
        (hidden, r_gate + r_up), (r_gate, inter), (r_up, inter), (inter, r_down), (r_down, hidden)
    )
    x = meta(tokens, hidden, dtype=dtype)
    with captured_launches(sms) as launches:
        if quantized is None:
            lowrank_gated_mlp(x, *(meta(*shape, dtype=dtype) for shape in shapes), "silu", schedule=schedule)
        else:
            quantized_gated_mlp(x, *(meta_quantized(*shape, quantized) for shape in shapes), "silu")
    return list(launches)


def corrected_launches(k: int, n: int, tokens: int, dtype: torch.dtype, sms: int) -> list[Launch]:
    """The decode launches of a ``(K, N)`` dense weight stored int4 with zero points (``compress --quantize
    int4-asym``) with a low-rank correction added in the same pass, its factors floating point and int8."""
    weight = meta_quantized(k, n, ZERO_POINT_LAYOUT)
    zeros = meta(n, -(-weight.scales.shape[1] // 2), dtype=torch.uint8)
    int8 = QuantizedLayout(8, None)
    corrections = (
        (meta(k, CORRECTION_RANK, dtype=dtype), meta(CORRECTION_RANK, n, dtype=dtype)),
        (meta_quantized(k, CORRECTION_RANK, int8), meta_quantized(CORRECTION_RANK, n, int8)),
    )
    x = meta(tokens, k, dtype=dtype)
    with captured_launches(sms) as launches:
        for correction in corrections:
            out = meta(tokens, n, dtype=dtype)
            quantized_matmul(
                x, weight.values, weight.scales, 4, 128, out, zero_points=zeros, correction=correction
            )
    return list(launches)
