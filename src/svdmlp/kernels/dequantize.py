"""Products with a factor ``W (K, N)`` stored quantized (:class:`svdmlp.int_weights.QuantizedMatrix`), one K
step at a time: the integer values are read as they are stored and dequantized in the inner loop, so that
a decode step streams a half (int8) or a quarter (int4) of a bf16 factor's bytes. The one home of that
logic for every kernel that reads quantized factors.

Storage read here: values ``(N, K)`` int8, or ``(N, ⌈K/2⌉)`` uint8 with inputs ``2j`` and ``2j+1`` in the
low and high nibbles of byte ``j``, each stored as value + 8; scales ``(N, groups)`` as the int16 bits of
fp16 values. That is the transpose of the float factors' ``(K, N)`` layout, read along K as they are: no
transpose at run time. One scale per output channel (``GROUP`` 0) is applied once, after the K loop
(:func:`channel_scaled`); with groups (``GROUP`` = 128 inputs) each K step lies inside one group
(BLOCK_K divides GROUP, steps start at multiples of BLOCK_K) and its partial product is scaled before
it is added (:func:`quantized_dot`). An asymmetric scheme's zero points (``(N, ⌈groups/2⌉)`` uint8, two
groups a byte as the values are packed) are taken off after the product, as the step's input sum times
zero and scale (:func:`zero_point_term`): the values are multiplied as they are.
"""

from __future__ import annotations

from typing import Protocol

import torch
import triton
import triton.language as tl

from svdmlp.kernels.common import dot_f32


class QuantizedScheme(Protocol):
    bits: int  # 8, or 4 (two values per byte)
    group: int | None  # inputs per scale; None: one scale per output channel


class QuantizedFactor(Protocol):
    """A factor ``W (K, N)`` stored as read here: what :class:`svdmlp.int_weights.QuantizedMatrix` holds
    (described rather than imported: it sits a layer above the kernels)."""

    in_features: int  # K
    out_features: int  # N
    values: torch.Tensor
    scales: torch.Tensor
    scheme: QuantizedScheme


def step_inside_group(block_k: int, group: int | None) -> int:
    """The K step a launcher may use: its own, or the group when that is shorter (a step inside a group)."""
    return block_k if group is None else min(block_k, group)


@triton.jit
def _scales(s_ptrs, mask):
    """The fp16 scales stored as int16 bits at ``s_ptrs``, in fp32 (0 where masked)."""
    bits = tl.load(s_ptrs, mask=mask, other=0)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def quantized_dot(
    a,
    q_rows,
    s_rows,
    n_in,
    k_start,
    q_width,
    BLOCK_K: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``a (BLOCK_M, BLOCK_K) @ W[k_start : k_start + BLOCK_K, n]`` in fp32, for the output channels ``n``
    whose value rows start at ``q_rows`` (pointers, shape (1, BLOCK_N)) and scale rows at ``s_rows``
    (BLOCK_N), ``n_in`` their bounds mask; ``q_width`` is the stored row width (K, or ⌈K/2⌉ bytes),
    passed rather than derived so that the compiler sees its divisibility and loads whole vectors.

    ``a`` must be 0 past K (the pad nibble of an odd K holds 0 anyway). The integers are exact in every
    compute dtype (|q| ≤ 127), so the dot multiplies them as they are in ``a``'s dtype; grouped scales
    come after it, in fp32; per-channel ones are left to :func:`channel_scaled`, once after the loop.
    """
    if BITS == 8:
        k = k_start + tl.arange(0, BLOCK_K)[:, None]
        q = tl.load(q_rows + k, mask=(k < q_width) & n_in[None, :], other=0)
    else:
        # Whole bytes, contiguous along K; their nibbles interleaved back into rows 2j (low), 2j + 1.
        j = k_start // 2 + tl.arange(0, BLOCK_K // 2)[:, None]
        byte = tl.load(q_rows + j, mask=(j < q_width) & n_in[None, :], other=0x88)  # 0x88: two zeros
        nibbles = tl.join(byte & 15, byte >> 4)  # (BLOCK_K / 2, BLOCK_N, 2)
        q = tl.reshape(tl.permute(nibbles, (0, 2, 1)), (BLOCK_K, byte.shape[1])).to(tl.int8) - 8
    # Through fp32: the interpreter turns integers into bf16 garbage (NaN) when cast directly.
    part = dot_f32(a, q.to(tl.float32).to(a.dtype), UPCAST_DOT, PRECISION)
    if GROUP > 0:
        # A merged loop may run past a shorter factor, whose group index would be out of range there.
        inside = k_start * BITS // 8 < q_width
        part = part * _scales(s_rows + k_start // GROUP, n_in & inside)[None, :]
    return part


@triton.jit
def channel_scaled(acc, s_rows, n_in, GROUP: tl.constexpr):
    """``acc`` (a sum of :func:`quantized_dot` over all of K) times its per-channel scales; grouped
    scales were applied step by step, so then ``acc`` as it is."""
    if GROUP == 0:
        acc = acc * _scales(s_rows, n_in)[None, :]
    return acc


@triton.jit
def zero_point_term(a, z_rows, s_rows, n_in, k_start, q_width, BITS: tl.constexpr, GROUP: tl.constexpr):
    """What an asymmetric scheme's zero points take off a K step's scaled product:
    ``Σ_k a[m, k] · zero[n] · scale[n]`` for the step's group (``W = (q − zero) · scale``), in fp32,
    ``z_rows`` pointing at each output channel's packed zero points (BLOCK_N)."""
    group = k_start // GROUP
    inside = n_in & (k_start * BITS // 8 < q_width)
    byte = tl.load(z_rows + group // 2, mask=inside, other=0x88)
    zero = ((byte >> (4 * (group % 2))) & 15).to(tl.float32) - 8
    total = tl.sum(a.to(tl.float32), axis=1)
    return total[:, None] * (zero * _scales(s_rows + group, inside))[None, :]
