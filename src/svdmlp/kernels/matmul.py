"""One GEMM stage of a low-rank product: the shrink ``t = x·u_t`` or the expand ``y = t·v_t``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from svdmlp.kernels import common, configs
from svdmlp.kernels.common import (
    dot_f32,
    dot_precision,
    gemm_tile,
    is_interpreted,
    prefetch_l2,
    prefetch_lines,
    zero_block,
    zero_share,
)


@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    zero_ptr,
    M,
    N,
    K,
    zero_numel,
    prefetch_rows,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    GDC: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
    PER_LINE: tl.constexpr,
):
    """``c = a @ b`` with fp32 accumulation; ``a`` is cast to ``b``'s dtype before each dot.

    Schedule: one program per (BLOCK_M × BLOCK_N) tile of ``c``, K streamed in BLOCK_K steps. The
    tile order is grouped along M (GROUP_M tiles of M per column of tiles) so that at prefill a column
    of ``b`` tiles is reused from L2 by neighbouring programs. At decode (one M tile) the grid is the
    N split alone: every program streams a distinct ``b`` column slab, so the factor is read once,
    spread over all SMs. ``a`` may be fp32 (the decode down strip, summed with atomics) and is
    rounded to the factor dtype like torch's intermediate, so that 16-bit dots use tensor cores.

    When ZERO_BLOCK > 0, each program also zeroes ZERO_BLOCK elements of ``zero_ptr`` (:func:`zero_share`).
    With GDC (programmatic dependent launch, :func:`svdmlp.kernels.configs.programmatic_launch`) the
    next launch may start at once, and this one waits for its predecessor before touching memory,
    first asking L2 for the first ``prefetch_rows`` rows of its ``b`` slab (:func:`prefetch_l2`).
    """
    rows, cols, ks, row_in, col_in, a_ptrs = gemm_tile(
        a_ptr, M, N, stride_am, stride_ak, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    if GDC:
        gdc_launch_dependents()
        if prefetch_rows > 0:
            slab = b_ptr + tl.min(cols, axis=0) * stride_bn
            prefetch_l2(slab, prefetch_rows, stride_bk, BLOCK_K, PREFETCH_LINES, PER_LINE)
        gdc_wait()
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn

    acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k_left = K - k_start
        a = tl.load(a_ptrs, mask=row_in & (ks[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] < k_left) & col_in, other=0.0)
        acc += dot_f32(a.to(b.dtype), b, UPCAST_DOT, PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_in & col_in)
    zero_share(zero_ptr, zero_numel, ZERO_BLOCK)


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    zero: torch.Tensor | None = None,
    dependent: bool = False,
) -> torch.Tensor:
    """``out[:] = a @ b`` for 2-D tensors of any strides; optionally zero ``zero`` (contiguous) on the way.

    ``a`` is (M, K) in ``b``'s dtype or fp32; ``b`` is (K, N); ``out`` is (M, N). Shapes are the
    caller's responsibility (the public ops validate them). ``dependent``: launched as the next link
    of a chain of svdmlp kernels (programmatic dependent launch where the GPU has it).
    """
    m, k = a.shape
    n = b.shape[1]
    interpreted = is_interpreted(_matmul_kernel)
    gdc = configs.programmatic_launch(b.device, interpreted)
    tiles = configs.matmul_tiles(m, n, k, b.dtype, configs.sm_count(b.device), interpreted)
    programs = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    lines, per_line = prefetch_lines(tiles.block_n, b.dtype)
    _matmul_kernel[(programs,)](
        a,
        b,
        out,
        out if zero is None else zero,
        m,
        n,
        k,
        0 if zero is None else zero.numel(),
        configs.prefetch_rows(k, gdc and dependent, b.stride(1) == 1),
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        GROUP_M=tiles.group_m,
        ZERO_BLOCK=zero_block(zero, programs),
        UPCAST_DOT=interpreted,
        PRECISION=dot_precision(b.dtype),
        GDC=gdc,
        PREFETCH_LINES=lines,
        PER_LINE=per_line,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        launch_pdl=gdc and dependent,
    )
    return out


def plain_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[:] = a @ b`` with nothing fused into it: Triton's weight-streaming tiles at decode sizes
    (M ≤ 16, where they spread the factor over every SM), the vendor library above."""
    if a.shape[0] <= configs.DECODE_MAX_TOKENS:
        return matmul(a, b, out)
    return common.library_matmul(a, b, out)
