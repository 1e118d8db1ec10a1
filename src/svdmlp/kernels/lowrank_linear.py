"""The low-rank linear ``y = (x·u_t)·v_t``: one fused kernel that keeps the strip ``x·u_t`` on chip,
or two GEMM stages (see :func:`svdmlp.kernels.configs.linear_schedule` for which runs when)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from svdmlp.kernels import common, configs
from svdmlp.kernels.common import (
    check_device,
    check_inner,
    check_inputs,
    device_guard,
    dot_f32,
    dot_precision,
    flatten_tokens,
    is_interpreted,
)
from svdmlp.kernels.matmul import plain_gemm

SCHEDULES = ("fused", "two_stage")


@triton.jit
def _lowrank_linear_kernel(
    x_ptr,
    u_ptr,
    v_ptr,
    y_ptr,
    M,
    K,
    R,
    N,
    stride_xm,
    stride_xk,
    stride_uk,
    stride_ur,
    stride_vr,
    stride_vn,
    stride_ym,
    stride_yn,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    RANK_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``y[rows] = (x[rows]·u_t)·v_t`` for one block of tokens and one share of the output columns.

    Schedule (the paper's caching kernel, §4.2.1): phase 1 streams K and builds the whole strip
    ``x[rows]·u_t`` (BLOCK_M × RANK_PAD, fp32) in registers; phase 2 streams the V column blocks of
    this program's share through it, so the strip is computed once per token block and share and
    never touches memory. The grid is (token blocks, N splits): each split recomputes the strip,
    traded for parallelism when token blocks alone would not fill the GPU. The strip is rounded to
    the factor dtype before phase 2, like torch's intermediate, which keeps 16-bit tensor cores.
    """
    pid_m = tl.program_id(0)
    pid_split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    rs = tl.arange(0, RANK_PAD)
    ns = tl.arange(0, BLOCK_N)
    row_in = rows[:, None] < M

    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :] * stride_xk
    u_ptrs = u_ptr + ks[:, None] * stride_uk + rs[None, :] * stride_ur
    strip = tl.full((BLOCK_M, RANK_PAD), 0, dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k_left = K - k_start
        x = tl.load(x_ptrs, mask=row_in & (ks[None, :] < k_left), other=0.0)
        u = tl.load(u_ptrs, mask=(ks[:, None] < k_left) & (rs[None, :] < R), other=0.0)
        strip += dot_f32(x, u, UPCAST_DOT, PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        u_ptrs += BLOCK_K * stride_uk
    strip_lowp = strip.to(v_ptr.dtype.element_ty)

    n_tiles = (N + BLOCK_N - 1) // BLOCK_N  # not tl.cdiv: see common's docstring
    tiles_per_split = (n_tiles + n_splits - 1) // n_splits
    first_tile = pid_split * tiles_per_split
    last_tile = tl.minimum(first_tile + tiles_per_split, n_tiles)
    for n_tile in range(first_tile, last_tile):
        cols = n_tile * BLOCK_N + ns
        v_ptrs = v_ptr + rs[:, None] * stride_vr + cols[None, :] * stride_vn
        v = tl.load(v_ptrs, mask=(rs[:, None] < R) & (cols[None, :] < N), other=0.0)
        y = dot_f32(strip_lowp, v, UPCAST_DOT, PRECISION)
        y_ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :] * stride_yn
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=row_in & (cols[None, :] < N))


def check_linear(op: str, x: torch.Tensor, u_t: torch.Tensor, v_t: torch.Tensor, prefix: str = "") -> None:
    """Raise ValueError unless ``x (..., in) @ u_t (in, r) @ v_t (r, out)`` is well formed."""
    check_inputs(op, x, {f"{prefix}u_t": u_t, f"{prefix}v_t": v_t})
    check_inner(op, "x.shape[-1]", x.shape[-1], f"{prefix}u_t.shape[0]", u_t.shape[0])
    check_inner(op, f"{prefix}u_t.shape[1] (rank)", u_t.shape[1], f"{prefix}v_t.shape[0]", v_t.shape[0])


def lowrank_linear_into(
    x2d: torch.Tensor, u_t: torch.Tensor, v_t: torch.Tensor, out: torch.Tensor, schedule: str | None = None
) -> None:
    """``out[:] = (x2d @ u_t) @ v_t`` for validated 2-D inputs; ``schedule`` forces one (tests)."""
    (m, k), (r, n) = x2d.shape, v_t.shape
    if min(m, k, r, n) == 0:
        out.zero_()
        return
    interpreted = is_interpreted(_lowrank_linear_kernel)
    sms = configs.sm_count(x2d.device)
    if schedule is None:
        schedule = configs.linear_schedule(m, k, r, n, x2d.dtype, sms, interpreted)
    if schedule not in SCHEDULES:
        raise ValueError(f"lowrank_linear: unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    if schedule == "two_stage":
        strip = common.new_empty((m, r), x2d.dtype, x2d.device)
        plain_gemm(x2d, u_t, strip)
        plain_gemm(strip, v_t, out)
        return
    tiles = configs.fused_linear_tiles(m, k, r, n, x2d.dtype, sms, interpreted)
    if tiles is None:
        raise ValueError(f"lowrank_linear: rank {r} is too large for the fused schedule in {x2d.dtype}")
    grid = (triton.cdiv(m, tiles.block_m), tiles.n_splits)
    _lowrank_linear_kernel[grid](
        x2d,
        u_t,
        v_t,
        out,
        m,
        k,
        r,
        n,
        x2d.stride(0),
        x2d.stride(1),
        u_t.stride(0),
        u_t.stride(1),
        v_t.stride(0),
        v_t.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_M=tiles.block_m,
        BLOCK_K=tiles.block_k,
        RANK_PAD=tiles.rank_pad,
        BLOCK_N=tiles.block_n,
        UPCAST_DOT=interpreted,
        PRECISION=dot_precision(x2d.dtype),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )


def lowrank_linear(
    x: torch.Tensor, u_t: torch.Tensor, v_t: torch.Tensor, *, schedule: str | None = None
) -> torch.Tensor:
    """``y = (x @ u_t) @ v_t``. x: (..., in), u_t: (in, r), v_t: (r, out) -> (..., out), in x's dtype.

    Same contract as :func:`svdmlp.backends.torch_ref.lowrank_linear`; fp32 accumulation, the strip
    rounded to x's dtype as torch does. ``schedule`` ("fused" or "two_stage") overrides the choice
    made from the shape; it exists for tests and benchmarks.
    """
    check_linear("lowrank_linear", x, u_t, v_t)
    check_device("lowrank_linear", x, _lowrank_linear_kernel)
    x2d = flatten_tokens(x)
    out = common.new_empty((x2d.shape[0], v_t.shape[1]), x.dtype, x.device)
    with device_guard(x.device):
        lowrank_linear_into(x2d, u_t, v_t, out, schedule)
    return out.reshape(*x.shape[:-1], v_t.shape[1])
