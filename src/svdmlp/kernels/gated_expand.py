"""The gated expand: ``h = act(t_g·V_g) · (t_u·V_u)`` from the shared strip, optionally fused with the
down projection's shrink ``t_d += h·U_down`` (the decode schedule)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from svdmlp.kernels import configs
from svdmlp.kernels.common import (
    activate_f32,
    dot_f32,
    dot_precision,
    grouped_tile,
    is_interpreted,
    prefetch_l2,
    prefetch_lines,
)


@triton.jit
def _strip_times_factor(
    strip_ptr,
    factor_ptr,
    rows,
    cols,
    M,
    N,
    R,
    stride_sm,
    stride_sr,
    stride_fr,
    stride_fn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``strip[rows, :R] @ factor[:R, cols]`` in fp32, R streamed in BLOCK_R steps."""
    rs = tl.arange(0, BLOCK_R)
    row_in = rows[:, None] < M
    col_in = cols[None, :] < N
    strip_ptrs = strip_ptr + rows[:, None].to(tl.int64) * stride_sm + rs[None, :] * stride_sr
    factor_ptrs = factor_ptr + rs[:, None] * stride_fr + cols[None, :] * stride_fn
    acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    for r_start in range(0, R, BLOCK_R):
        r_left = R - r_start
        strip = tl.load(strip_ptrs, mask=row_in & (rs[None, :] < r_left), other=0.0)
        factor = tl.load(factor_ptrs, mask=(rs[:, None] < r_left) & col_in, other=0.0)
        acc += dot_f32(strip, factor, UPCAST_DOT, PRECISION)
        strip_ptrs += BLOCK_R * stride_sr
        factor_ptrs += BLOCK_R * stride_fr
    return acc


@triton.jit
def _strip_times_factors(
    strip_ptr,
    gate_v_ptr,
    up_v_ptr,
    rows,
    cols,
    M,
    N,
    R,
    stride_sm,
    stride_sr,
    stride_gr,
    stride_gn,
    stride_ur,
    stride_un,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``(strip[rows, :R] @ V_g[:, cols], strip[rows, R:2R] @ V_u[:, cols])`` in one loop over their
    common rank: one pipeline fill and drain instead of two, twice the factor bytes per stage."""
    rs = tl.arange(0, BLOCK_R)
    row_in = rows[:, None] < M
    col_in = cols[None, :] < N
    gate_strip_ptrs = strip_ptr + rows[:, None].to(tl.int64) * stride_sm + rs[None, :] * stride_sr
    up_strip_ptrs = gate_strip_ptrs + R * stride_sr
    gate_ptrs = gate_v_ptr + rs[:, None] * stride_gr + cols[None, :] * stride_gn
    up_ptrs = up_v_ptr + rs[:, None] * stride_ur + cols[None, :] * stride_un
    gate = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    up = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    for r_start in range(0, R, BLOCK_R):
        r_left = R - r_start
        strip_mask = row_in & (rs[None, :] < r_left)
        factor_mask = (rs[:, None] < r_left) & col_in
        gate_strip = tl.load(gate_strip_ptrs, mask=strip_mask, other=0.0)
        up_strip = tl.load(up_strip_ptrs, mask=strip_mask, other=0.0)
        gate += dot_f32(gate_strip, tl.load(gate_ptrs, mask=factor_mask, other=0.0), UPCAST_DOT, PRECISION)
        up += dot_f32(up_strip, tl.load(up_ptrs, mask=factor_mask, other=0.0), UPCAST_DOT, PRECISION)
        gate_strip_ptrs += BLOCK_R * stride_sr
        up_strip_ptrs += BLOCK_R * stride_sr
        gate_ptrs += BLOCK_R * stride_gr
        up_ptrs += BLOCK_R * stride_ur
    return gate, up


@triton.jit
def _gated_expand_kernel(
    strip_ptr,
    gate_v_ptr,
    up_v_ptr,
    hidden_ptr,
    down_u_ptr,
    down_strip_ptr,
    M,
    N,
    R_GATE,
    R_UP,
    R_DOWN,
    prefetch_rows,
    stride_sm,
    stride_sr,
    stride_gr,
    stride_gn,
    stride_ur,
    stride_un,
    stride_hm,
    stride_hn,
    stride_dn,
    stride_dr,
    stride_tm,
    stride_tr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_RD: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOWN_STAGES: tl.constexpr,
    ACTIVATION: tl.constexpr,
    MERGED: tl.constexpr,
    FUSE_DOWN_SHRINK: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    GDC: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
    PER_LINE: tl.constexpr,
):
    """One (BLOCK_M × BLOCK_N) tile of ``h = act(strip[:, :R_GATE]·V_g) · (strip[:, R_GATE:]·V_u)``.

    Schedule: gate and up accumulate in two fp32 tiles, in one loop when their ranks are equal (MERGED;
    the rank rule gives them equal ranks) else one loop each, and meet in the epilogue (fp32), so
    neither ever reaches memory; ``h`` is rounded to the factor dtype (torch's
    intermediate). Without FUSE_DOWN_SHRINK ``h`` is stored (prefill: the down projection is a
    separate compute-bound GEMM pair). With it (decode) the tile is multiplied at once by its
    BLOCK_N rows of U_down and added with fp32 atomics into the zeroed down strip ``t_d (M, R_DOWN)``:
    a split-K over the intermediate dimension that reads U_down exactly once, spread over the same
    programs that stream V_g and V_u, and keeps ``h`` on chip. Atomics cost M·R_DOWN per program,
    negligible next to the weight bytes for M ≤ 16 (their order makes the last bits vary run to run).
    GDC: as in :func:`svdmlp.kernels.matmul._matmul_kernel`, the first ``prefetch_rows`` rows of the
    V_g and V_u slabs asked of L2 before the wait.
    """
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    if GDC:
        gdc_launch_dependents()
        if prefetch_rows > 0:
            first = pid_n * BLOCK_N
            prefetch_l2(
                gate_v_ptr + first * stride_gn, prefetch_rows, stride_gr, BLOCK_R, PREFETCH_LINES, PER_LINE
            )
            prefetch_l2(
                up_v_ptr + first * stride_un, prefetch_rows, stride_ur, BLOCK_R, PREFETCH_LINES, PER_LINE
            )
        gdc_wait()
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)

    if MERGED:
        gate, up = _strip_times_factors(
            strip_ptr,
            gate_v_ptr,
            up_v_ptr,
            rows,
            cols,
            M,
            N,
            R_GATE,
            stride_sm,
            stride_sr,
            stride_gr,
            stride_gn,
            stride_ur,
            stride_un,
            BLOCK_M,
            BLOCK_N,
            BLOCK_R,
            UPCAST_DOT,
            PRECISION,
        )
    else:
        gate = _strip_times_factor(
            strip_ptr,
            gate_v_ptr,
            rows,
            cols,
            M,
            N,
            R_GATE,
            stride_sm,
            stride_sr,
            stride_gr,
            stride_gn,
            BLOCK_M,
            BLOCK_N,
            BLOCK_R,
            UPCAST_DOT,
            PRECISION,
        )
        up = _strip_times_factor(
            strip_ptr + R_GATE * stride_sr,
            up_v_ptr,
            rows,
            cols,
            M,
            N,
            R_UP,
            stride_sm,
            stride_sr,
            stride_ur,
            stride_un,
            BLOCK_M,
            BLOCK_N,
            BLOCK_R,
            UPCAST_DOT,
            PRECISION,
        )
    hidden = (activate_f32(gate, ACTIVATION) * up).to(gate_v_ptr.dtype.element_ty)

    if FUSE_DOWN_SHRINK:
        # Rows >= M and columns >= N of `hidden` are exact zeros (masked loads), so they add nothing.
        rds = tl.arange(0, BLOCK_RD)
        down_ptrs = down_u_ptr + cols[:, None] * stride_dn + rds[None, :] * stride_dr
        out_ptrs = down_strip_ptr + rows[:, None].to(tl.int64) * stride_tm + rds[None, :] * stride_tr
        # Its own pipeline depth: the U_down slices are small, so this loop needs more stages than the
        # gate/up loop to keep as many bytes in flight.
        for rd_start in tl.range(0, R_DOWN, BLOCK_RD, num_stages=DOWN_STAGES):
            rd_in = rds[None, :] < R_DOWN - rd_start
            down_u = tl.load(down_ptrs, mask=(cols[:, None] < N) & rd_in, other=0.0)
            partial = dot_f32(hidden, down_u, UPCAST_DOT, PRECISION)
            tl.atomic_add(out_ptrs, partial, mask=(rows[:, None] < M) & rd_in, sem="relaxed")
            down_ptrs += BLOCK_RD * stride_dr
            out_ptrs += BLOCK_RD * stride_tr
    else:
        hidden_ptrs = hidden_ptr + rows[:, None].to(tl.int64) * stride_hm + cols[None, :] * stride_hn
        tl.store(hidden_ptrs, hidden, mask=(rows[:, None] < M) & (cols[None, :] < N))


def gated_expand(
    strip: torch.Tensor,
    gate_v_t: torch.Tensor,
    up_v_t: torch.Tensor,
    activation: str,
    hidden: torch.Tensor | None = None,
    down_u_t: torch.Tensor | None = None,
    down_strip: torch.Tensor | None = None,
    dependent: bool = False,
) -> None:
    """Either store ``h`` into ``hidden (M, inter)``, or add ``h @ down_u_t`` into ``down_strip (M, r_down)``.

    ``strip`` is (M, r_gate + r_up) in the factor dtype; ``down_strip`` is fp32 and must hold zeros.
    Shapes are the caller's responsibility (the public op validates them). ``dependent``: as in
    :func:`svdmlp.kernels.matmul.matmul`.
    """
    fuse_down = down_strip is not None
    if fuse_down == (hidden is not None) or fuse_down != (down_u_t is not None):
        raise ValueError("gated_expand: pass either `hidden`, or both `down_u_t` and `down_strip`")
    m = strip.shape[0]
    r_gate, n = gate_v_t.shape
    r_up = up_v_t.shape[0]
    interpreted = is_interpreted(_gated_expand_kernel)
    gdc = configs.programmatic_launch(strip.device, interpreted)
    tiles = configs.gated_expand_tiles(
        m, n, gate_v_t.dtype, configs.sm_count(strip.device), interpreted, fuse_down
    )
    programs = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    lines, per_line = prefetch_lines(tiles.block_n, gate_v_t.dtype)
    contiguous = gate_v_t.stride(1) == 1 and up_v_t.stride(1) == 1
    # Unused pointer arguments get a tensor of the right kind; the constexpr branch never touches them.
    hidden_arg = hidden if hidden is not None else strip
    down_u_arg = down_u_t if fuse_down else gate_v_t
    down_strip_arg = down_strip if fuse_down else strip
    _gated_expand_kernel[(programs,)](
        strip,
        gate_v_t,
        up_v_t,
        hidden_arg,
        down_u_arg,
        down_strip_arg,
        m,
        n,
        r_gate,
        r_up,
        down_u_arg.shape[1] if fuse_down else 0,
        configs.prefetch_rows(min(r_gate, r_up), gdc and dependent, contiguous),
        strip.stride(0),
        strip.stride(1),
        gate_v_t.stride(0),
        gate_v_t.stride(1),
        up_v_t.stride(0),
        up_v_t.stride(1),
        hidden_arg.stride(0),
        hidden_arg.stride(1),
        down_u_arg.stride(0),
        down_u_arg.stride(1),
        down_strip_arg.stride(0),
        down_strip_arg.stride(1),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_R=tiles.block_r,
        BLOCK_RD=tiles.block_rd,
        GROUP_M=tiles.group_m,
        DOWN_STAGES=tiles.down_stages,
        ACTIVATION=activation,
        MERGED=r_gate == r_up,
        FUSE_DOWN_SHRINK=fuse_down,
        UPCAST_DOT=interpreted,
        PRECISION=dot_precision(gate_v_t.dtype),
        GDC=gdc,
        PREFETCH_LINES=lines,
        PER_LINE=per_line,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        launch_pdl=gdc and dependent,
    )
