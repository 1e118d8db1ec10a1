"""The decode gated expand on quantized factors: ``h = act(t_g·V_g) · (t_u·V_u)`` from the shared strip,
shrunk at once by U_down into the down strip, V_g, V_u and U_down read as stored and dequantized in
their inner loops (:mod:`svdmlp.kernels.dequantize`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from svdmlp.kernels import configs
from svdmlp.kernels.common import activate_f32, dot_precision, grouped_tile, is_interpreted
from svdmlp.kernels.dequantize import QuantizedFactor, channel_scaled, quantized_dot, step_inside_group


@triton.jit
def _quantized_gated_expand_kernel(
    strip_ptr,
    gate_q_ptr,
    gate_s_ptr,
    up_q_ptr,
    up_s_ptr,
    down_q_ptr,
    down_s_ptr,
    down_strip_ptr,
    M,
    N,
    R_GATE,
    R_UP,
    R_DOWN,
    gate_width,
    up_width,
    down_width,
    stride_sm,
    stride_sr,
    stride_gq,
    stride_gs,
    stride_uq,
    stride_us,
    stride_dq,
    stride_ds,
    stride_tm,
    stride_tr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_RD: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOWN_STAGES: tl.constexpr,
    ACTIVATION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One (BLOCK_M × BLOCK_N) tile of ``h``, added through U_down into the zeroed fp32 down strip.

    The schedule of the float kernel's decode (:func:`svdmlp.kernels.gated_expand._gated_expand_kernel`
    with FUSE_DOWN_SHRINK): gate and up accumulate in fp32 tiles in one loop over their ranks (a shorter
    one's steps past its end load nothing), meet in the epilogue, and ``h``, rounded to the compute
    dtype, never leaves the chip: its BLOCK_N columns are the K step of ``h·U_down`` (inside one int4
    group: BLOCK_N divides it), summed over the programs with fp32 atomics (split-K over ``inter``).
    The quantized layouts ``(inter, r)`` and ``(r_down, inter)`` are read along their rows as stored.
    """
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows[:, None] < M
    col_in = cols < N
    rs = tl.arange(0, BLOCK_R)

    gate_rows, gate_scales = gate_q_ptr + cols[None, :] * stride_gq, gate_s_ptr + cols * stride_gs
    up_rows, up_scales = up_q_ptr + cols[None, :] * stride_uq, up_s_ptr + cols * stride_us
    gate_strip_ptrs = strip_ptr + rows[:, None].to(tl.int64) * stride_sm + rs[None, :] * stride_sr
    up_strip_ptrs = gate_strip_ptrs + R_GATE * stride_sr
    gate = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    up = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.float32)
    for r_start in range(0, tl.maximum(R_GATE, R_UP), BLOCK_R):
        gate_strip = tl.load(gate_strip_ptrs, mask=row_in & (rs[None, :] < R_GATE - r_start), other=0.0)
        up_strip = tl.load(up_strip_ptrs, mask=row_in & (rs[None, :] < R_UP - r_start), other=0.0)
        gate += quantized_dot(
            gate_strip,
            gate_rows,
            gate_scales,
            col_in,
            r_start,
            gate_width,
            BLOCK_R,
            BITS,
            GROUP,
            UPCAST_DOT,
            PRECISION,
        )
        up += quantized_dot(
            up_strip,
            up_rows,
            up_scales,
            col_in,
            r_start,
            up_width,
            BLOCK_R,
            BITS,
            GROUP,
            UPCAST_DOT,
            PRECISION,
        )
        gate_strip_ptrs += BLOCK_R * stride_sr
        up_strip_ptrs += BLOCK_R * stride_sr
    gate = channel_scaled(gate, gate_scales, col_in, GROUP)
    up = channel_scaled(up, up_scales, col_in, GROUP)
    hidden = (activate_f32(gate, ACTIVATION) * up).to(strip_ptr.dtype.element_ty)

    # Rows >= M and columns >= N of `hidden` are exact zeros (masked loads), so they add nothing.
    rds = tl.arange(0, BLOCK_RD)
    out_ptrs = down_strip_ptr + rows[:, None].to(tl.int64) * stride_tm + rds[None, :] * stride_tr
    # Its own pipeline depth, as in the float kernel: the U_down slices are small.
    for rd_start in tl.range(0, R_DOWN, BLOCK_RD, num_stages=DOWN_STAGES):
        rd = rd_start + rds
        rd_in = rd < R_DOWN
        down_rows, down_scales = down_q_ptr + rd[None, :] * stride_dq, down_s_ptr + rd * stride_ds
        partial = quantized_dot(
            hidden,
            down_rows,
            down_scales,
            rd_in,
            pid_n * BLOCK_N,
            down_width,
            BLOCK_N,
            BITS,
            GROUP,
            UPCAST_DOT,
            PRECISION,
        )
        partial = channel_scaled(partial, down_scales, rd_in, GROUP)
        tl.atomic_add(out_ptrs, partial, mask=row_in & rd_in[None, :], sem="relaxed")
        out_ptrs += BLOCK_RD * stride_tr


def quantized_gated_expand(
    strip: torch.Tensor,
    gate_v_t: QuantizedFactor,
    up_v_t: QuantizedFactor,
    down_u_t: QuantizedFactor,
    activation: str,
    down_strip: torch.Tensor,
) -> None:
    """Add ``h @ down_u_t`` into ``down_strip (M, r_down)`` (fp32, holding zeros); ``strip`` is
    ``(M, r_gate + r_up)`` in the compute dtype. The factors share one scheme; shapes are the caller's
    responsibility (the public op validates them)."""
    m = strip.shape[0]
    r_gate, n, r_up = gate_v_t.in_features, gate_v_t.out_features, up_v_t.in_features
    how = down_u_t.scheme
    interpreted = is_interpreted(_quantized_gated_expand_kernel)
    sms = configs.sm_count(strip.device)
    tiles = configs.quantized_gated_expand_tiles(m, n, strip.dtype, how.bits, sms, interpreted)
    block_n = step_inside_group(tiles.block_n, how.group)  # the down shrink's K step
    programs = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, block_n)
    _quantized_gated_expand_kernel[(programs,)](
        strip,
        gate_v_t.values,
        gate_v_t.scales,
        up_v_t.values,
        up_v_t.scales,
        down_u_t.values,
        down_u_t.scales,
        down_strip,
        m,
        n,
        r_gate,
        r_up,
        down_u_t.out_features,
        gate_v_t.values.shape[1],
        up_v_t.values.shape[1],
        down_u_t.values.shape[1],
        strip.stride(0),
        strip.stride(1),
        gate_v_t.values.stride(0),
        gate_v_t.scales.stride(0),
        up_v_t.values.stride(0),
        up_v_t.scales.stride(0),
        down_u_t.values.stride(0),
        down_u_t.scales.stride(0),
        down_strip.stride(0),
        down_strip.stride(1),
        BITS=how.bits,
        GROUP=0 if how.group is None else how.group,
        BLOCK_M=tiles.block_m,
        BLOCK_N=block_n,
        BLOCK_R=step_inside_group(tiles.block_r, how.group),
        BLOCK_RD=tiles.block_rd,
        GROUP_M=tiles.group_m,
        DOWN_STAGES=tiles.down_stages,
        ACTIVATION=activation,
        UPCAST_DOT=interpreted,
        PRECISION=dot_precision(strip.dtype),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
