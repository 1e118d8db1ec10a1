"""``c = a @ W`` for a factor ``W (K, N)`` stored quantized (:class:`svdmlp.int_weights.QuantizedMatrix`),
its values dequantized in the K loop (:mod:`svdmlp.kernels.dequantize`), zero points included, and
optionally a low-rank correction ``c += (a @ U) @ V`` in the same pass (:mod:`svdmlp.quantized_linear`):
each K step's ``a`` also meets its rows of ``U``, ``a·U`` stays on chip, and ``V``'s columns are added
in the epilogue. For decode sizes only (M ≤
:data:`svdmlp.kernels.configs.DECODE_MAX_TOKENS`): above, a GEMM is compute-bound and the caller
dequantizes once for the vendor library instead (at 128 × 128 tiles the int4 unpacking spills registers
on sm_90).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from svdmlp.kernels import configs
from svdmlp.kernels.common import dot_f32, dot_precision, gemm_tile, is_interpreted, zero_block, zero_share
from svdmlp.kernels.dequantize import channel_scaled, quantized_dot, step_inside_group, zero_point_term


@triton.jit
def _quantized_matmul_kernel(
    a_ptr,
    q_ptr,
    s_ptr,
    c_ptr,
    zero_ptr,
    z_ptr,
    u_ptr,
    us_ptr,
    v_ptr,
    vs_ptr,
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
    RANK,
    stride_uk,
    stride_ur,
    stride_us,
    stride_vr,
    stride_vn,
    stride_vs,
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
    CORRECTION: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """One program per (BLOCK_M × BLOCK_N) tile of ``c``, K streamed in BLOCK_K steps. ``a`` may be fp32
    (the quantized gated MLP's down strip) and is rounded to ``c``'s dtype, the compute dtype, first.
    With ZERO_POINT, ``z_ptr`` holds an asymmetric scheme's packed zero points (grouped schemes only).
    CORRECTION 16: ``u (K, RANK)`` and ``v (RANK, N)`` floating point, element (i, j) at ``i·stride_*k|r
    + j·stride_*r|n``; 8: both int8 as a QuantizedMatrix stores them, rows of ``u``'s values (RANK, K)
    ``stride_uk`` apart and of ``v``'s (N, RANK) ``stride_vn`` apart, one scale a row; 0: none.
    When ZERO_BLOCK > 0, each program also zeroes ZERO_BLOCK elements of ``zero_ptr`` (:func:`zero_share`)."""
    rows, cols, ks, row_in, col_in, a_ptrs = gemm_tile(
        a_ptr, M, N, stride_am, stride_ak, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    q_rows = q_ptr + cols[None, :].to(tl.int64) * stride_qn
    s_rows = s_ptr + cols.to(tl.int64) * stride_sn
    z_rows = z_ptr + cols.to(tl.int64) * stride_zn
    n_in = cols < N

    rs = tl.arange(0, BLOCK_R)
    r_in = rs < RANK
    u_rows = u_ptr + rs[None, :].to(tl.int64) * stride_uk  # int8: each rank's row of values
    us_rows = us_ptr + rs * stride_us
    u_ptrs = u_ptr + ks[:, None] * stride_uk + rs[None, :] * stride_ur  # floating point

    acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    shrunk = tl.full((BLOCK_M, BLOCK_R), 0, dtype=tl.float32)  # a·U, kept here
    for k_start in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=row_in & (ks[None, :] < K - k_start), other=0.0)
        a = a.to(c_ptr.dtype.element_ty)
        acc += quantized_dot(
            a, q_rows, s_rows, n_in, k_start, q_width, BLOCK_K, BITS, GROUP, UPCAST_DOT, PRECISION
        )
        if ZERO_POINT:
            acc -= zero_point_term(a, z_rows, s_rows, n_in, k_start, q_width, BITS, GROUP)
        if CORRECTION == 16:
            u = tl.load(u_ptrs, mask=(ks[:, None] < K - k_start) & r_in[None, :], other=0.0)
            shrunk += dot_f32(a, u.to(a.dtype), UPCAST_DOT, PRECISION)
            u_ptrs += BLOCK_K * stride_uk
        if CORRECTION == 8:
            shrunk += quantized_dot(
                a, u_rows, us_rows, r_in, k_start, K, BLOCK_K, 8, 0, UPCAST_DOT, PRECISION
            )
        a_ptrs += BLOCK_K * stride_ak
    acc = channel_scaled(acc, s_rows, n_in, GROUP)
    if CORRECTION == 16:
        v_ptrs = v_ptr + rs[:, None] * stride_vr + cols[None, :].to(tl.int64) * stride_vn
        v = tl.load(v_ptrs, mask=r_in[:, None] & n_in[None, :], other=0.0)
        t = shrunk.to(c_ptr.dtype.element_ty)
        acc += dot_f32(t, v.to(t.dtype), UPCAST_DOT, PRECISION)
    if CORRECTION == 8:
        t = channel_scaled(shrunk, us_rows, r_in, 0).to(c_ptr.dtype.element_ty)
        v_rows = v_ptr + cols[None, :].to(tl.int64) * stride_vn
        vs_rows = vs_ptr + cols.to(tl.int64) * stride_vs
        expanded = quantized_dot(t, v_rows, vs_rows, n_in, 0, RANK, BLOCK_R, 8, 0, UPCAST_DOT, PRECISION)
        acc += channel_scaled(expanded, vs_rows, n_in, 0)

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
    correction: tuple | None = None,
) -> torch.Tensor:
    """``out[:] = a @ W``: ``a (M, K)`` in ``out``'s dtype or fp32, ``W`` of ``values``/``scales`` (and an
    asymmetric scheme's packed ``zero_points``) as :mod:`svdmlp.kernels.dequantize` reads them, ``out (M,
    N)``; plus ``(a @ u_t) @ v_t`` for a ``correction`` ``(u_t, v_t)`` that :func:`fuses` takes; optionally
    zero ``zero`` (contiguous) on the way. Shapes are the caller's responsibility."""
    m, k = a.shape
    n = values.shape[0]
    mode, rank, u, us, v, vs, strides = _correction_operands(correction, scales)
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
        u,
        us,
        v,
        vs,
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
        rank,
        *strides,
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
        CORRECTION=mode,
        BLOCK_R=max(16, triton.next_power_of_2(rank)),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out


# The largest correction rank the kernel keeps ``a·U`` for on chip (beside the weight tile's accumulator).
MAX_CORRECTION_RANK = 64


def _int8_factor(factor) -> bool:
    scheme = getattr(factor, "scheme", None)
    return scheme is not None and scheme.bits == 8 and scheme.group is None and not scheme.zero_point


def fuses(u_t, v_t) -> bool:
    """Whether :func:`quantized_matmul` takes the correction ``(u_t, v_t)`` in its pass: both factors
    floating-point tensors or both int8 with a scale per output channel, of rank up to
    :data:`MAX_CORRECTION_RANK`."""
    floating = isinstance(u_t, torch.Tensor) and isinstance(v_t, torch.Tensor)
    rank = u_t.shape[1] if floating else getattr(u_t, "out_features", MAX_CORRECTION_RANK + 1)
    return (floating or (_int8_factor(u_t) and _int8_factor(v_t))) and rank <= MAX_CORRECTION_RANK


def _correction_operands(correction: tuple | None, placeholder: torch.Tensor) -> tuple:
    """The kernel's correction arguments: mode (0, 16 floating, 8 int8), rank, the four pointers and the
    six strides (``stride_uk, stride_ur, stride_us, stride_vr, stride_vn, stride_vs``)."""
    if correction is None:
        return 0, 0, placeholder, placeholder, placeholder, placeholder, (0,) * 6
    u_t, v_t = correction
    if not fuses(u_t, v_t):
        raise ValueError("the correction's factors are neither both floating point nor both int8")
    if isinstance(u_t, torch.Tensor):  # u_t (K, R), v_t (R, N)
        strides = (u_t.stride(0), u_t.stride(1), 0, v_t.stride(0), v_t.stride(1), 0)
        return 16, u_t.shape[1], u_t, placeholder, v_t, placeholder, strides
    # int8 as stored: u's values (R, K), v's (N, R), each row with its scale
    strides = (u_t.values.stride(0), 0, u_t.scales.stride(0), 0, v_t.values.stride(0), v_t.scales.stride(0))
    return 8, u_t.out_features, u_t.values, u_t.scales, v_t.values, v_t.scales, strides
