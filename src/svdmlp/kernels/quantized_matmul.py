"""``c = a @ W`` for a factor ``W (K, N)`` stored quantized (:class:`svdmlp.int_weights.QuantizedMatrix`):
the integer values are read as they are stored and dequantized in the inner loop, so that a decode step
streams a half (int8) or a quarter (int4) of a bf16 factor's bytes. For decode sizes only (M ≤
:data:`svdmlp.kernels.configs.DECODE_MAX_TOKENS`): above, a GEMM is compute-bound and the caller
dequantizes once for the vendor library instead (at 128 × 128 tiles the int4 unpacking spills registers
on sm_90).

Storage read here: values ``(N, K)`` int8, or ``(N, ⌈K/2⌉)`` uint8 with inputs ``2j`` and ``2j+1`` in the
low and high nibbles of byte ``j``, each stored as value + 8; scales ``(N, groups)`` as the int16 bits of
fp16 values. One scale per output channel (``GROUP`` 0) is applied once, after the K loop; with groups
(``GROUP`` = 128 inputs) each K step lies inside one group (BLOCK_K divides GROUP) and its partial
product is scaled before it is added.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from svdmlp.kernels import configs
from svdmlp.kernels.common import dot_f32, dot_precision, gemm_tile, is_interpreted


@triton.jit
def _quantized_matmul_kernel(
    a_ptr,
    q_ptr,
    s_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_qn,
    stride_sn,
    stride_cm,
    stride_cn,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program per (BLOCK_M × BLOCK_N) tile of ``c``, K streamed in BLOCK_K steps; the integer
    values are exact in every compute dtype (|q| ≤ 127), so the dot multiplies them as they are and the
    scales come after, in fp32."""
    rows, cols, ks, row_in, col_in, a_ptrs = gemm_tile(
        a_ptr, M, N, stride_am, stride_ak, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    q_rows = q_ptr + cols[None, :].to(tl.int64) * stride_qn

    acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k = k_start + ks[:, None]
        k_in = k < K
        a = tl.load(a_ptrs, mask=row_in & (ks[None, :] < K - k_start), other=0.0)
        if BITS == 8:
            q = tl.load(q_rows + k, mask=k_in & col_in, other=0).to(tl.float32)
        else:
            byte = tl.load(q_rows + k // 2, mask=k_in & col_in, other=0).to(tl.int32)
            q = (((byte >> ((k % 2) * 4)) & 15) - 8).to(tl.float32)
            q = tl.where(k_in & col_in, q, 0.0)
        part = dot_f32(a, q.to(a.dtype), UPCAST_DOT, PRECISION)
        if GROUP > 0:
            bits = tl.load(s_ptr + cols.to(tl.int64) * stride_sn + k_start // GROUP, mask=cols < N, other=0)
            part = part * bits.to(tl.float16, bitcast=True).to(tl.float32)[None, :]
        acc += part
        a_ptrs += BLOCK_K * stride_ak
    if GROUP == 0:
        bits = tl.load(s_ptr + cols.to(tl.int64) * stride_sn, mask=cols < N, other=0)
        acc = acc * bits.to(tl.float16, bitcast=True).to(tl.float32)[None, :]

    c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_in & col_in)


def quantized_matmul(
    a: torch.Tensor,
    values: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    group: int | None,
    out: torch.Tensor,
) -> torch.Tensor:
    """``out[:] = a @ W``: ``a (M, K)``, ``W`` of ``values``/``scales`` as above, ``out (M, N)`` in
    ``a``'s dtype. Shapes are the caller's responsibility."""
    m, k = a.shape
    n = values.shape[0]
    interpreted = is_interpreted(_quantized_matmul_kernel)
    tiles = configs.matmul_tiles(m, n, k, a.dtype, configs.sm_count(a.device), interpreted)
    block_k = tiles.block_k if group is None else min(tiles.block_k, group)  # a K step inside a group
    programs = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    _quantized_matmul_kernel[(programs,)](
        a,
        values,
        scales,
        out,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        values.stride(0),
        scales.stride(0),
        out.stride(0),
        out.stride(1),
        BITS=bits,
        GROUP=0 if group is None else group,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=block_k,
        GROUP_M=tiles.group_m,
        UPCAST_DOT=interpreted,
        PRECISION=dot_precision(a.dtype),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out
