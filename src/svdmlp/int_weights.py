"""Integer weights: the schemes svdmlp quantizes with, and the stored form of a quantized matrix that the
low-rank modules multiply by.

Schemes, symmetric, scales in fp16 (their bytes counted):
- ``int8``: one scale per output channel: ``1 + 2/in`` bytes per weight;
- ``int4``: one scale per group of 128 consecutive inputs of an output channel, two values per byte:
  ``0.5 + 2/128`` bytes per weight.

Values are rounded to the nearest point of the grid whose largest step holds the group's largest
magnitude (absmax round-to-nearest, as llama.cpp's Q8_0/Q4_0 and the literature's baselines), or, given
the Gram of the inputs a matrix multiplies, by :func:`gptq` on the same grid (how calibrated recipes
store their factors: :mod:`svdmlp.compression.quantized_factors`). Scales
that minimise each group's squared weight error instead (clipping its largest values) were measured and
dropped: on SmolLM2-135M they left dense int4 as it was and made int4 factors much worse (×3.77 against
×2.58 of dense perplexity, BENCHMARKS.md), since the factors' largest entries matter most. A matrix is
always quantized along the inputs it sums over: as ``(N, K)``, N output channels, which is also the
layout CPU int8 kernels read.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from svdmlp import runtime
from svdmlp.config import FACTOR_BITS

SCALE_BYTES = 2  # fp16
_GPTQ_BLOCK = 128
# Looked up once, not at every product of a decode step (the Triton kernel is imported when first used).
_HAS_TRITON = importlib.util.find_spec("triton") is not None


@dataclass(frozen=True)
class Scheme:
    """``bits`` per weight and an fp16 scale per ``group`` inputs of a row. Symmetric: the integers
    ``-qmax..qmax`` around zero. Asymmetric (``zero_point``): ``2^bits`` levels spanning each group's
    own range (its minimum to its maximum, zero included), shifted by a zero point of ``bits`` bits per
    group: one level more, and none wasted on a side the group does not reach (GPTQ's and HQQ's way
    at 2-4 bits)."""

    name: str
    bits: int
    group: int | None  # inputs per scale; None: the whole row (per output channel)
    zero_point: bool = False

    @property
    def qmax(self) -> int:
        """The largest integer magnitude of the symmetric grid; the asymmetric grid's top level."""
        return 2**self.bits - 1 if self.zero_point else 2 ** (self.bits - 1) - 1

    def groups(self, cols: int) -> int:
        return 1 if self.group is None else -(-cols // self.group)

    def nbytes(self, rows: int, cols: int) -> int:
        """Bytes of a quantized ``rows × cols`` weight, packed values, scales and zero points."""
        groups = rows * self.groups(cols)
        zeros = -(-groups * self.bits // 8) if self.zero_point else 0
        return -(-rows * cols * self.bits // 8) + groups * SCALE_BYTES + zeros


SCHEMES = {"int8": Scheme("int8", 8, None), "int4": Scheme("int4", 4, 128)}  # the packed kernels' own
# What a QuantizedMatrix stores: those, and for dense weights (compress --quantize) int4 with zero points,
# which torch's CPU int4 kernel and svdmlp's Triton decode kernel take as they are.
STORED = {**SCHEMES, "int4-asym": Scheme("int4-asym", 4, 128, zero_point=True)}


def scheme(name: str) -> Scheme:
    """The scheme ``name`` names: ``int8`` (per output channel) and ``int4`` (groups of 128), the two the
    packed kernels run, or any ``intB`` (B from 2 to 8: groups of 128, int8 per channel) or ``intBgG``
    (groups of G inputs), which fake quantization evaluates at its packed bytes; fp16 scales, symmetric
    unless the name ends in ``-asym`` (a zero point per group, :class:`Scheme`)."""
    if name in SCHEMES:
        return SCHEMES[name]
    match = re.fullmatch(r"int([2-8])(?:g([1-9][0-9]*))?(-asym)?", name)
    if match is None:
        raise ValueError(
            f"unknown quantization {name!r}; expected intB[gG][-asym] (B bits from 2 to 8, G inputs per "
            "scale, -asym for a zero point per group; int8 and int4 are the packed kernels' own)"
        )
    bits = int(match[1])
    group = int(match[2]) if match[2] else (None if bits == 8 else 128)
    if group is not None and group % 8:
        raise ValueError(f"quantization {name!r}: the group must be a multiple of 8 inputs")
    return Scheme(name, bits, group, zero_point=match[3] is not None)


def factor_scheme(bits: int) -> Scheme | None:
    """The scheme of ``--factor-bits bits`` (None: not quantized)."""
    if bits not in FACTOR_BITS:
        raise ValueError(f"factor bits must be one of {sorted(FACTOR_BITS)}, got {bits!r}")
    name = FACTOR_BITS[bits]
    return None if name is None else SCHEMES[name]


def quantize(weight: torch.Tensor, how: Scheme, return_zeros: bool = False):
    """``(q, scales)`` of an ``(N, K)`` weight: integers in ``[-qmax, qmax]`` as int8 ``(N, groups,
    group)`` (the last group padded with zeros) and fp16 scales ``(N, groups, 1)``, with
    ``weight ≈ q · scale`` (error at most half a scale per weight). An asymmetric scheme's integers come
    with their zero point taken off (int16, ``q − zero`` in ``[−zero, 2^bits − 1 − zero]``), so that the
    same product gives the value. With ``return_zeros``, also the zero points ``(N, groups, 1)`` (all 0 for
    a symmetric scheme), which only the stored form needs."""
    if weight.dim() != 2:
        raise ValueError(f"quantize needs a 2-D weight, got shape {tuple(weight.shape)}")
    if not runtime.all_finite(weight):
        raise ValueError("the weight holds NaN or infinite values; it cannot be quantized")
    groups = _grouped(weight.float(), how)
    scales, zeros = _grid(groups, how)
    rounded = _on_grid(groups, scales[..., None].float(), zeros[..., None], how), scales[..., None]
    return (*rounded, zeros[..., None]) if return_zeros else rounded


def gptq(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    how: Scheme,
    damping: float = 0.01,
    return_zeros: bool = False,
):
    """``(q, scales)`` of an ``(N, K)`` weight rounded to minimise ``tr(E H Eᵀ)``, ``E`` the rounding
    error and ``H (K, K)`` the Gram of the inputs it multiplies, rather than each entry's own error.

    GPTQ (Frantar et al., 2022): the inputs are rounded one at a time, and each one's error is moved onto
    the inputs not yet rounded along the inverse Hessian's Cholesky rows, so that correlated inputs make
    up for it. Scales are absmax ones as in :func:`quantize`, of the row (int8) or of each group of 128
    (int4) as the error updates have left it when the group's turn comes. ``damping`` times the mean
    diagonal is added to ``H`` (as GPTQ does) so that it can be inverted. Returns ``(q, scales)`` in
    :func:`quantize`'s form (with ``return_zeros``, and the zero points, as there).
    """
    if weight.dim() != 2 or hessian.shape != (weight.shape[1], weight.shape[1]):
        raise ValueError(
            f"gptq needs an (N, K) weight and a (K, K) Hessian, got {tuple(weight.shape)}, "
            f"{tuple(hessian.shape)}"
        )
    if not (runtime.all_finite(weight) and runtime.all_finite(hessian)):
        raise ValueError("the weight or its Hessian holds NaN or infinite values; it cannot be quantized")
    rows, cols = weight.shape
    w = weight.double().clone()
    h = hessian.double().clone()
    unused = torch.diagonal(h) <= 0  # an input never seen: its weights cannot matter, round them alone
    h[unused, unused] = 1.0
    h += damping * torch.diagonal(h).mean() * torch.eye(cols, dtype=h.dtype, device=h.device)
    inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    block = how.group or _GPTQ_BLOCK  # error moved within a block at once, onto later blocks in one product
    q = torch.empty(rows, cols, dtype=torch.int16 if how.zero_point else torch.int8, device=weight.device)
    scales = torch.empty(rows, how.groups(cols), dtype=torch.float16, device=weight.device)
    zeros = torch.zeros(rows, how.groups(cols), dtype=w.dtype, device=weight.device)
    if how.group is None:
        scales[:, 0], zeros[:, 0] = _grid(w, how)
    for start in range(0, cols, block):
        end = min(start + block, cols)
        part, errors = w[:, start:end].clone(), torch.zeros(rows, end - start, dtype=w.dtype, device=w.device)
        group = 0 if how.group is None else start // block
        if how.group is not None:
            scales[:, group], zeros[:, group] = _grid(part, how)
        scale, zero = scales[:, group].double(), zeros[:, group]
        tail = inverse[start:end, start:end]
        for j in range(end - start):
            rounded = _on_grid(part[:, j], scale, zero, how).double()
            q[:, start + j] = rounded.to(q.dtype)
            errors[:, j] = (part[:, j] - rounded * scale) / tail[j, j]
            part[:, j:] -= errors[:, j : j + 1] * tail[j : j + 1, j:]
        w[:, end:] -= errors @ inverse[start:end, end:]
    group = cols if how.group is None else how.group
    rounded = F.pad(q, (0, -cols % group)).reshape(rows, -1, group), scales[..., None]
    return (*rounded, zeros[..., None]) if return_zeros else rounded


def _grid(values: torch.Tensor, how: Scheme) -> tuple[torch.Tensor, torch.Tensor]:
    """fp16 scales and zero points (zero for a symmetric scheme) of the grid for ``values`` along their
    last dimension, with that dimension dropped."""
    if how.zero_point:
        return _range_grid(values, how.qmax)
    return _absmax_scales(values, how.qmax), torch.zeros(
        values.shape[:-1], dtype=values.dtype, device=values.device
    )


def _range_grid(values: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The asymmetric grid: ``top + 1`` levels from the smallest to the largest value (zero always
    within, so that zero stays exact), as an fp16 scale and an integer zero point in ``[0, top]``."""
    low = values.amin(-1).clamp(max=0)
    high = values.amax(-1).clamp(min=0)
    scales = ((high - low) / top).to(torch.float16)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    zeros = torch.round(-low.double() / scales.double()).clamp(0, top)
    return scales, zeros.to(values.dtype)


def _on_grid(values: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, how: Scheme) -> torch.Tensor:
    """``values`` rounded onto the grid of ``scale`` (and ``zero``), as integers: symmetric ones in
    int8, asymmetric ones with their zero point taken off in int16 (see :func:`quantize`)."""
    if not how.zero_point:
        return torch.round(values / scale).clamp(-how.qmax, how.qmax).to(torch.int8)
    shifted = torch.round(values.double() / scale).add(zero).clamp(0, how.qmax)
    return (shifted - zero).to(torch.int16)


def _absmax_scales(values: torch.Tensor, qmax: int) -> torch.Tensor:
    """fp16 scales putting the largest magnitude along the last dimension on the grid's last step (an
    all-zero group: any scale, 1), with that dimension dropped."""
    scales = (values.abs().amax(-1) / qmax).to(torch.float16)
    return torch.where(scales > 0, scales, torch.ones_like(scales))


def dequantize(q: torch.Tensor, scales: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The float32 ``(N, K)`` weight of ``shape`` that ``(q, scales)`` stand for."""
    rows, cols = shape
    return (q.float() * scales.float()).reshape(rows, -1)[:, :cols]


@dataclass
class FakeQuantization:
    """Weights replaced in place by the values their integers stand for (what an int8/int4 kernel would
    multiply by), for evaluation; what that cost, weight by weight."""

    how: Scheme
    mlp_bytes: int = 0
    mlp_bytes_bf16: int = 0
    max_rel_error: float = 0.0
    correction_params: int = 0

    @torch.no_grad()
    def replace(
        self,
        weight: torch.Tensor,
        q: torch.Tensor,
        scales: torch.Tensor,
        correction: tuple[torch.Tensor, torch.Tensor] | None = None,
        correction_how: Scheme | None = None,
    ) -> None:
        """Put the value of ``(q, scales)`` (:func:`quantize`'s form) in place of ``weight`` and count it;
        with a low-rank ``correction`` ``(v, u)``, the value plus ``v @ u``, its factors counted in bf16,
        or rounded to nearest by ``correction_how`` along the dimension each sums over and counted packed."""
        restored = dequantize(q, scales, tuple(weight.shape))
        self.mlp_bytes += self.how.nbytes(*weight.shape)
        if correction is not None:
            v, u = (factor.float() for factor in correction)
            if correction_how is not None:
                v, u = (dequantize(*quantize(f, correction_how), tuple(f.shape)) for f in (v, u))
                self.mlp_bytes += sum(correction_how.nbytes(*f.shape) for f in (v, u))
            else:
                self.mlp_bytes += 2 * (v.numel() + u.numel())
            restored += v @ u
            self.correction_params += v.numel() + u.numel()
        error = (restored - weight.float()).norm() / weight.float().norm().clamp_min(1e-30)
        self.max_rel_error = max(self.max_rel_error, float(error))
        weight.copy_(restored.to(weight.dtype))
        self.mlp_bytes_bf16 += 2 * weight.numel()

    def counts(self) -> dict:
        """What it has counted: the numbers :meth:`add` takes back (a layer's, kept by a stopped run)."""
        return {
            "mlp_bytes": self.mlp_bytes,
            "mlp_bytes_bf16": self.mlp_bytes_bf16,
            "max_rel_error": self.max_rel_error,
            "correction_params": self.correction_params,
        }

    def add(self, counts: dict) -> None:
        """Count what another tally counted (:meth:`counts`)."""
        self.mlp_bytes += counts["mlp_bytes"]
        self.mlp_bytes_bf16 += counts["mlp_bytes_bf16"]
        self.max_rel_error = max(self.max_rel_error, counts["max_rel_error"])
        self.correction_params += counts["correction_params"]

    def report(self) -> dict:
        """The scheme, the bytes quantized and in bf16, and the largest relative error of one weight."""
        how = self.how
        return {
            "scheme": how.name,
            "bits": how.bits,
            "group": how.group,
            **({"zero_point": True} if how.zero_point else {}),
            "mlp_bytes": self.mlp_bytes,
            "mlp_bytes_bf16": self.mlp_bytes_bf16,
            "max_rel_error": self.max_rel_error,
            **({"correction_params": self.correction_params} if self.correction_params else {}),
        }


def _grouped(weight: torch.Tensor, how: Scheme) -> torch.Tensor:
    """``(rows, groups, group)`` view of ``weight``, the last group padded with zeros."""
    rows, cols = weight.shape
    group = cols if how.group is None else how.group
    padding = -cols % group
    if padding:
        weight = F.pad(weight, (0, padding))
    return weight.reshape(rows, -1, group)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two int4 values per byte: ``(N, C)`` int8 in [-7, 7] (C even) to ``(N, C/2)`` uint8, column
    ``2j`` in the low nibble and ``2j+1`` in the high one, each stored as value + 8."""
    biased = (q.to(torch.int16) + 8).to(torch.uint8)
    return biased[:, 0::2] | (biased[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The ``(N, 2·C)`` int8 values of :func:`pack_int4`'s ``(N, C)`` bytes."""
    low = (packed & 0x0F).to(torch.int8) - 8
    high = (packed >> 4).to(torch.int8) - 8
    return torch.stack((low, high), dim=-1).reshape(packed.shape[0], -1)


class QuantizedMatrix(nn.Module):
    """A ``(K, N)`` matrix ``W`` quantized by a scheme, used as ``x @ W``.

    Stored as kernels read it, ``(N, K)`` (the transpose of the low-rank modules' float layout: CPU int8
    kernels want it so): ``values`` int8 ``(N, K)`` or, for 4 bits, uint8 ``(N, ⌈K/2⌉)`` two per byte;
    ``scales`` ``(N, groups)``, the bits of their fp16 values held as int16, so that ``model.to(dtype)``
    (which casts every floating-point tensor) never rounds them to bf16. An asymmetric scheme stores each
    value as its level less ``2^(bits−1)`` (so that it packs as a symmetric one) and ``zeros``, each
    group's zero point less the same, packed like the values: the weight is ``(value − zero) · scale``.
    """

    def __init__(self, in_features: int, out_features: int, how: Scheme, device=None):
        super().__init__()
        if how not in STORED.values():
            raise ValueError(
                f"{how.name} is evaluated by fake quantization only; stored and run quantized are "
                f"{', '.join(STORED)}"
            )
        self.in_features, self.out_features, self.scheme = in_features, out_features, how
        width, dtype = (in_features, torch.int8) if how.bits == 8 else (-(-in_features // 2), torch.uint8)
        self.register_buffer("values", torch.empty(out_features, width, dtype=dtype, device=device))
        groups = how.groups(in_features)
        self.register_buffer("scales", torch.empty(out_features, groups, dtype=torch.int16, device=device))
        if how.zero_point:
            self.register_buffer(
                "zeros", torch.empty(out_features, -(-groups // 2), dtype=torch.uint8, device=device)
            )

    @classmethod
    @torch.no_grad()
    def of(cls, matrix: torch.Tensor, how: Scheme, hessian: torch.Tensor | None = None) -> QuantizedMatrix:
        """``matrix (K, N)`` quantized along its K inputs: each entry rounded to nearest, or, given the
        Gram ``hessian (K, K)`` of the inputs it multiplies, rounded together by :func:`gptq`."""
        rounded = (
            quantize(matrix.T, how, True)
            if hessian is None
            else gptq(matrix.T, hessian, how, return_zeros=True)
        )
        return cls.rounded(*rounded, how, matrix.shape[0])

    @classmethod
    @torch.no_grad()
    def rounded(
        cls, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, how: Scheme, in_features: int
    ) -> QuantizedMatrix:
        """The matrix of integers, scales and zero points already rounded (:func:`quantize`'s or
        :func:`gptq`'s form with ``return_zeros``: ``(N, groups, group)``, ``(N, groups, 1)`` twice; the
        zero points None for a symmetric scheme) of ``in_features`` inputs, packed."""
        k, n = in_features, q.shape[0]
        quantized = cls(k, n, how, device=q.device)
        if how.zero_point:
            bias = 2 ** (how.bits - 1)
            zero = zeros.reshape(n, -1).round().to(torch.int16)
            q = (q.to(torch.int16) + zero[..., None] - bias).to(torch.int8)  # the levels, less the bias
            quantized.zeros.copy_(pack_int4(F.pad(zero - bias, (0, zero.shape[1] % 2)).to(torch.int8)))
        q = q.reshape(n, -1)[:, :k]
        quantized.values.copy_(q if how.bits == 8 else pack_int4(F.pad(q, (0, k % 2))))
        quantized.scales.copy_(scales.reshape(n, -1).view(torch.int16))
        return quantized

    @classmethod
    def around(
        cls,
        values: torch.Tensor,
        scales: torch.Tensor,
        how: Scheme,
        in_features: int,
        zeros: torch.Tensor | None = None,
    ) -> QuantizedMatrix:
        """A matrix holding ``values``, ``scales`` (and an asymmetric scheme's ``zeros``) as they are (no
        copy): rebuilt from its tensors where only tensors can pass (:mod:`svdmlp.backends.compiled_ops`,
        the vLLM plugin's parameters)."""
        matrix = cls(in_features, values.shape[0], how, device="meta")
        matrix.values, matrix.scales = values, scales
        if how.zero_point:
            matrix.zeros = zeros
        return matrix

    def _values(self) -> torch.Tensor:
        """The ``(N, K)`` integer values, unpacked."""
        return self.values if self.scheme.bits == 8 else unpack_int4(self.values)[:, : self.in_features]

    def _zeros(self) -> torch.Tensor | None:
        """The ``(N, groups)`` zero points less the bias (None for a symmetric scheme)."""
        if not self.scheme.zero_point:
            return None
        return unpack_int4(self.zeros)[:, : self.scales.shape[1]]

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``(N, K)`` weight these values stand for, in ``dtype``: ``Wᵀ``."""
        scales = self.scales.view(torch.float16).to(dtype)
        values, zeros = self._values().to(dtype), self._zeros()
        if self.scheme.group is None:
            return (values if zeros is None else values - zeros.to(dtype)) * scales
        padded = F.pad(values, (0, -self.in_features % self.scheme.group))
        groups = padded.reshape(self.out_features, scales.shape[1], -1)
        if zeros is not None:  # a symmetric matrix (every factor) pays for no subtraction
            groups = groups - zeros.to(dtype)[..., None]
        return (groups * scales[..., None]).reshape(self.out_features, -1)[:, : self.in_features]

    def nbytes(self) -> int:
        """Bytes of the packed values, the scales and the zero points, as stored."""
        zeros = self.zeros.numel() if self.scheme.zero_point else 0
        return self.values.numel() * self.values.element_size() + self.scales.numel() * SCALE_BYTES + zeros

    def matmul(self, x: torch.Tensor, correction: tuple | None = None) -> torch.Tensor:
        """``x @ W`` for ``x (..., K)``. At decode sizes on CUDA, svdmlp's Triton kernel, which reads
        the packed values; on CPU with bf16/fp16 activations, torch's weight-only kernels (int8: about
        3.5× faster than a bf16 GEMM of the same shape here, int4: about 6×); otherwise the dequantized
        weight in ``x``'s dtype (cuBLAS on a GPU). Plus ``(x @ u_t) @ v_t`` for a low-rank
        ``correction`` ``(u_t, v_t)`` in the same pass, where :meth:`fuses_correction` says so."""
        if self._triton_fits(x):
            from svdmlp.kernels.quantized_matmul import quantized_matmul

            rows = x.reshape(-1, self.in_features)
            out = torch.empty(rows.shape[0], self.out_features, dtype=x.dtype, device=x.device)
            how = self.scheme
            zeros = self.zeros if how.zero_point else None
            quantized_matmul(
                rows,
                self.values,
                self.scales,
                how.bits,
                how.group,
                out,
                zero_points=zeros,
                correction=correction,
            )
            return out.reshape(*x.shape[:-1], self.out_features)
        if correction is not None:
            raise ValueError("a correction is added in the product's own pass only at decode on CUDA")
        if self._int8_kernel_fits(x):
            rows = x.reshape(-1, self.in_features).contiguous()  # the kernel reads rows densely
            scales = self.scales.view(torch.float16).to(x.dtype).reshape(-1)
            out = torch._weight_int8pack_mm(rows, self.values, scales)
            return out.reshape(*x.shape[:-1], self.out_features)
        if self._int4_kernel_fits(x):
            packed, scales_and_zeros = self._int4_cpu_operands(x.dtype)
            padding = packed.shape[1] * 2 - self.in_features
            rows = F.pad(x.reshape(-1, self.in_features), (0, padding)).contiguous()
            out = torch._weight_int4pack_mm_for_cpu(rows, packed, self.scheme.group, scales_and_zeros)
            return out[:, : self.out_features].reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.dequantized(x.dtype))

    def _int4_cpu_operands(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The values and scales in the layout of torch's CPU int4 kernel (values + 8 tiled its way,
        inputs padded to whole groups and outputs to 16; zero points 0), made once per dtype and kept
        beside the portable ones: a plain attribute, never saved."""
        zeros = self.zeros.data_ptr() if self.scheme.zero_point else None
        key = (dtype, self.values.data_ptr(), self.scales.data_ptr(), zeros)
        cached = self.__dict__.get("_int4_cpu")
        if cached is None or cached[0] != key:
            group = self.scheme.group
            padded = F.pad(self._values(), (0, -self.in_features % group, 0, -self.out_features % 16))
            packed = torch._convert_weight_to_int4pack_for_cpu(padded.to(torch.int32) + 8, 2)
            scales = F.pad(self.scales.view(torch.float16).to(dtype), (0, 0, 0, -self.out_features % 16))
            # The kernel computes (value + 8 − 8)·scale + offset: a zero point is the offset −zero·scale.
            zeros = self._zeros()
            offsets = (
                torch.zeros_like(scales)
                if zeros is None
                else -F.pad(zeros.to(dtype), (0, 0, 0, -self.out_features % 16)) * scales
            )
            scales_and_zeros = torch.stack((scales.T, offsets.T), dim=-1).contiguous()
            cached = self.__dict__["_int4_cpu"] = (key, packed, scales_and_zeros)
        return cached[1], cached[2]

    def _int4_kernel_fits(self, x: torch.Tensor) -> bool:
        return (
            self.scheme.bits == 4
            and x.device.type == "cpu"
            and x.dtype in (torch.bfloat16, torch.float16)
            and not torch.is_grad_enabled()
        )

    def fuses_correction(self, x: torch.Tensor, u_t, v_t) -> bool:
        """Whether :meth:`matmul` adds the correction ``(u_t, v_t)`` in its own pass for ``x``: svdmlp's
        Triton kernel at decode on CUDA, factors floating point or int8 (``a·U`` kept on chip)."""
        if not self._triton_fits(x):
            return False
        from svdmlp.kernels.quantized_matmul import fuses

        return fuses(u_t, v_t)

    def _triton_fits(self, x: torch.Tensor) -> bool:
        if x.device.type != "cuda" or torch.is_grad_enabled() or not _HAS_TRITON:
            return False
        from svdmlp.kernels.configs import DECODE_MAX_TOKENS

        return x.numel() // self.in_features <= DECODE_MAX_TOKENS

    def _int8_kernel_fits(self, x: torch.Tensor) -> bool:
        # The kernel reads past the end (NaN, or a crash) when K is not a multiple of 16 (torch 2.13),
        # and expects contiguous rows: both seen here on awkward shapes.
        return (
            self.scheme.bits == 8
            and not self.scheme.zero_point
            and x.device.type == "cpu"
            and x.dtype in (torch.bfloat16, torch.float16)
            and self.in_features % 16 == 0
            and not torch.is_grad_enabled()
        )

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, scheme={self.scheme.name}"


def is_quantized(factor: torch.Tensor | QuantizedMatrix) -> bool:
    """Whether a factor is stored quantized: the one place the two kinds of factor are told apart. Anything
    but a plain tensor counts, as long as it multiplies like a :class:`QuantizedMatrix` (``matmul``,
    ``in_features``): the vLLM plugin hands the kernels its own such view of vLLM's parameters."""
    return not isinstance(factor, torch.Tensor)


def stored_bytes(factor: torch.Tensor | QuantizedMatrix) -> int:
    """Bytes a factor takes as stored, whether floating point or quantized (packed, with its scales)."""
    if is_quantized(factor):
        return factor.nbytes()
    return factor.numel() * factor.element_size()
