"""What every kernel launcher shares: input validation, buffer allocation and the `@triton.jit` helpers.

Kept apart from the kernels so that each kernel file holds one kernel and its launcher only.

Interpreter rule for every kernel here: use only builtins of ``triton.language`` (``tl.full``, not
``tl.zeros``; integer division, not ``tl.cdiv``). The standard library's helpers are ``@triton.jit``
functions created when ``triton.language`` is first imported; if that happened before
TRITON_INTERPRET=1 was set (transformers imports Triton), the interpreter cannot call them.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def is_interpreted(kernel: object) -> bool:
    """Whether ``kernel`` runs in the Triton interpreter (TRITON_INTERPRET=1 when it was defined)."""
    return not isinstance(kernel, triton.runtime.JITFunction)


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact IEEE fp32 products for fp32 inputs, as torch's default matmul.

    On a GPU fp32 ``tl.dot`` defaults to TF32 (10-bit mantissa, ~1e-3 relative error); fp32 callers
    expect fp32 results, so fp32 pays for FMA-based dots. 16-bit inputs ignore the setting.
    """
    return "ieee" if dtype == torch.float32 else "tf32"


def new_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer a launcher allocates comes from here (tests poison it with NaN through this hook)."""
    return torch.empty(shape, dtype=dtype, device=device)


def library_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[:] = a @ b`` by the vendor library (cuBLAS on a GPU): the engine for a plain GEMM once the
    tokens no longer make it a weight stream (M > 16), where its tuned tiles, split-K and TMA beat
    Triton pointer loads and fusion would buy nothing. The one place such a GEMM is issued (the launch
    capture records it here)."""
    return torch.mm(a, b, out=out)


def device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """Launch on the tensors' GPU even when it is not the current one (Triton launches on the current)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def flatten_tokens(x: torch.Tensor) -> torch.Tensor:
    """View ``x (..., in)`` as ``(M, in)``; copies only when the leading dims cannot be merged as a view."""
    return x.reshape(-1, x.shape[-1])


def check_inputs(op: str, x: torch.Tensor, factors: dict[str, torch.Tensor]) -> None:
    """Raise ValueError, naming shapes, dtypes and devices, unless ``x`` and ``factors`` can run together."""
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{op}: x has dtype {x.dtype}; supported: {SUPPORTED_DTYPES}")
    if x.dim() < 1:
        raise ValueError(f"{op}: x must have at least one dimension (..., in); got shape {tuple(x.shape)}")
    for name, tensor in factors.items():
        if tensor.dim() != 2:
            raise ValueError(f"{op}: {name} must be 2-D; got shape {tuple(tensor.shape)}")
        if tensor.dtype != x.dtype:
            raise ValueError(
                f"{op}: {name} has dtype {tensor.dtype} but x has {x.dtype}; cast them to one dtype"
            )
        if tensor.device != x.device:
            raise ValueError(f"{op}: {name} is on {tensor.device} but x is on {x.device}")


def check_device(op: str, x: torch.Tensor, kernel: object) -> None:
    """Triton kernels need CUDA tensors, or CPU tensors when the kernels are interpreted."""
    if is_interpreted(kernel):
        if x.device.type != "cpu":
            raise ValueError(
                f"{op}: the Triton interpreter (TRITON_INTERPRET=1) runs on CPU tensors; x is on {x.device}"
            )
    elif x.device.type != "cuda":
        raise ValueError(
            f"{op}: Triton kernels need CUDA tensors; x is on {x.device} "
            "(set TRITON_INTERPRET=1 before importing svdmlp.kernels to run them slowly on CPU)"
        )


def check_inner(op: str, left: str, left_size: int, right: str, right_size: int) -> None:
    """Raise ValueError unless two dimensions that must agree do."""
    if left_size != right_size:
        raise ValueError(f"{op}: {left} ({left_size}) must equal {right} ({right_size})")


@triton.jit
def dot_f32(a, b, UPCAST_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """``a @ b`` accumulated in fp32.

    UPCAST_DOT is set only under the interpreter, whose 16-bit ``tl.dot`` is wrong for bf16 (it multiplies
    raw bit patterns) and slow for fp16 (numpy has no fp16 BLAS); on a GPU the 16-bit operands go to the
    tensor cores as they are.
    """
    if UPCAST_DOT:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def activate_f32(gate, ACTIVATION: tl.constexpr):
    """The gate nonlinearity in fp32: SiLU, or GELU with the tanh approximation.

    GELU-tanh is written as ``g · sigmoid(2·c·(g + 0.044715·g³))``, which equals
    ``0.5·g·(1 + tanh(c·(g + 0.044715·g³)))`` and needs no tanh (not a core ``triton.language`` op;
    libdevice's would tie the kernel to one backend), with no cancellation near ``g = 0``.
    """
    if ACTIVATION == "silu":
        sigmoid_arg = gate
    else:
        sigmoid_arg = 1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)  # 2·sqrt(2/π)·(...)
    return gate / (1.0 + tl.exp(-sigmoid_arg))


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a linear program id to (tile row, tile column), walking GROUP_M tile rows down one tile
    column before moving right, so that programs running together share operand tiles in L2."""
    n_tiles = (N + BLOCK_N - 1) // BLOCK_N
    tiles_per_group = GROUP_M * n_tiles
    first_m_tile = (pid // tiles_per_group) * GROUP_M
    group_rows = tl.minimum((M + BLOCK_M - 1) // BLOCK_M - first_m_tile, GROUP_M)
    pid_m = first_m_tile + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def gemm_tile(
    a_ptr,
    M,
    N,
    stride_am,
    stride_ak,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """This program's tile of ``c = a @ b`` (grouped order, :func:`grouped_tile`): its rows and
    columns, the K offsets of one step, their bounds masks, and the pointers to its first ``a`` tile."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_in = rows[:, None] < M
    col_in = cols[None, :] < N
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + ks[None, :] * stride_ak
    return rows, cols, ks, row_in, col_in, a_ptrs


# Bytes of one L2 cache line: the unit a prefetch asks for.
CACHE_LINE = 128


def prefetch_lines(block_n: int, dtype: torch.dtype) -> tuple[int, int]:
    """(lines per row, elements per line) of a ``block_n``-wide slab of ``dtype`` for :func:`prefetch_l2`."""
    per_line = CACHE_LINE // dtype.itemsize
    return max(1, triton.cdiv(block_n, per_line)), per_line


@triton.jit
def prefetch_l2(ptr, rows, stride_row, BLOCK_ROWS: tl.constexpr, LINES: tl.constexpr, PER_LINE: tl.constexpr):
    """Ask the L2 cache for the first ``rows`` rows of a slab at ``ptr`` (LINES lines of PER_LINE
    elements per row, rows ``stride_row`` elements apart) without waiting for them.

    For a dependent launch of the decode chain: its weights do not depend on its predecessor, so they
    can be on their way while the predecessor still streams its own, before ``gdc_wait``; the loads
    after it then hit L2. A hint (inline PTX ``prefetch.global.L2``; GPU only, so callers guard it with
    a flag the interpreter never sets); rows past the slab are clamped to its last.
    """
    row_offsets = tl.arange(0, BLOCK_ROWS)
    line_offsets = tl.arange(0, LINES) * PER_LINE
    for start in range(0, rows, BLOCK_ROWS):
        slab_rows = tl.minimum(start + row_offsets, rows - 1)
        addresses = ptr + slab_rows[:, None].to(tl.int64) * stride_row + line_offsets[None, :]
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; // dummy $0", "=r,l", [addresses], dtype=tl.int32, is_pure=False, pack=1
        )


def zero_block(zero: torch.Tensor | None, programs: int) -> int:
    """Elements of ``zero`` (contiguous) each of ``programs`` programs clears with :func:`zero_share`
    (0: nothing to clear)."""
    if zero is None or zero.numel() == 0:
        return 0
    return triton.next_power_of_2(triton.cdiv(zero.numel(), programs))


@triton.jit
def zero_share(zero_ptr, zero_numel, ZERO_BLOCK: tl.constexpr):
    """Clear this program's ZERO_BLOCK elements of ``zero_ptr``: a GEMM clears the fp32 buffer that the
    next kernel accumulates into, saving a memset launch (the gated MLPs' down strip)."""
    if ZERO_BLOCK > 0:
        zero_offsets = tl.program_id(0) * ZERO_BLOCK + tl.arange(0, ZERO_BLOCK)
        zeros = tl.full((ZERO_BLOCK,), 0, dtype=zero_ptr.dtype.element_ty)
        tl.store(zero_ptr + zero_offsets, zeros, mask=zero_offsets < zero_numel)
