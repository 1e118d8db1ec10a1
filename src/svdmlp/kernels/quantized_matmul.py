"""``c = a @ W`` for a factor ``W (K, N)`` stored quantized (:class:`svdmlp.int_weights.QuantizedMatrix`),
its values dequantized in the K loop (:mod:`svdmlp.kernels.dequantize`), zero points included. For decode sizes only (M ≤
:data:`svdmlp.kernels.configs.DECODE_MAX_TOKENS`): above, a GEMM is compute-bound and the caller
dequantizes once for the vendor library instead (at 128 × 128 tiles the int4 unpacking spills registers
on sm_90).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from svdmlp.kernels import configs
from svdmlp.kernels.common import dot_precision, gemm_tile, is_interpreted, zero_block, zero_share
from svdmlp.kernels.dequantize import channel_scaled, quantized_dot, step_inside_group, zero_point_term


@triton.jit
def _quantized_matmul_kernel(
    a_ptr,
    q_ptr,
    s_ptr,
    c_ptr,
    zero_ptr,
    z_ptr,
    M,
    N,
    K,
    q_width,
    zero_numel,
    stride_am,
    stride_ak,
    stride_qn,
    stride_sn,
    stride_zn,
    stride_cm,
    stride_cn,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    ZERO_POINT: tl.constexpr,
):
    """One program per (BLOCK_M × BLOCK_N) tile of ``c``, K streamed in BLOCK_K steps. ``a`` may be fp32
    (the quantized gated MLP's down strip) and is rounded to ``c``'s dtype, the compute dtype, first.
    With ZERO_POINT, ``z_ptr`` holds an asymmetric scheme's packed zero points (grouped schemes only).
    When ZERO_BLOCK > 0, each program also zeroes ZERO_BLOCK elements of ``zero_ptr`` (:func:`zero_share`)."""
    rows, cols, ks, row_in, col_in, a_ptrs = gemm_tile(
        a_ptr, M, N, stride_am, stride_ak, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    q_rows = q_ptr + cols[None, :].to(tl.int64) * stride_qn
    s_rows = s_ptr + cols.to(tl.int64) * stride_sn
    z_rows = z_ptr + cols.to(tl.int64) * stride_zn
    n_in = cols < N

    acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=row_in & (ks[None, :] < K - k_start), other=0.0)
        a = a.to(c_ptr.dtype.element_ty)
        acc += quantized_dot(
            a, q_rows, s_rows, n_in, k_start, q_width, BLOCK_K, BITS, GROUP, UPCAST_DOT, PRECISION
        )
        if ZERO_POINT:
            acc -= zero_point_term(a, z_rows, s_rows, n_in, k_start, q_width, BITS, GROUP)
        a_ptrs += BLOCK_K * stride_ak
    acc = channel_scaled(acc, s_rows, n_in, GROUP)

    c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_in & col_in)
    zero_share(zero_ptr, zero_numel, ZERO_BLOCK)


def quantized_matmul(
    a: torch.Tensor,
    values: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    group: int | None,
    out: torch.Tensor,
    zero: torch.Tensor | None = None,
    zero_points: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[:] = a @ W``: ``a (M, K)`` in ``out``'s dtype or fp32, ``W`` of ``values``/``scales`` (and an
    asymmetric scheme's packed ``zero_points``) as :mod:`svdmlp.kernels.dequantize` reads them, ``out (M,
    N)``; optionally zero ``zero`` (contiguous) on the way. Shapes are the caller's responsibility."""
    m, k = a.shape
    n = values.shape[0]
    interpreted = is_interpreted(_quantized_matmul_kernel)
    tiles = configs.matmul_tiles(m, n, k, out.dtype, configs.sm_count(a.device), interpreted)
    programs = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    _quantized_matmul_kernel[(programs,)](
        a,
        values,
        scales,
        out,
        out if zero is None else zero,
        scales if zero_points is None else zero_points,
        m,
        n,
        k,
        values.shape[1],
        0 if zero is None else zero.numel(),
        a.stride(0),
        a.stride(1),
        values.stride(0),
        scales.stride(0),
        0 if zero_points is None else zero_points.stride(0),
        out.stride(0),
        out.stride(1),
        BITS=bits,
        GROUP=0 if group is None else group,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=step_inside_group(tiles.block_k, group),
        GROUP_M=tiles.group_m,
        ZERO_BLOCK=zero_block(zero, programs),
        UPCAST_DOT=interpreted,
        PRECISION=dot_precision(out.dtype),
        ZERO_POINT=zero_points is not None,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out
