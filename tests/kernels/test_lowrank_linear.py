"""The fused low-rank linear against a float64 evaluation of the torch reference."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import triton

from svdmlp.backends import torch_ref
from svdmlp.kernels import common, configs, lowrank_linear
from svdmlp.kernels.common import check_device

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (in, rank, out): nothing a multiple of the interpreter's 64-wide blocks; ranks not powers of two.
SHAPES = ((96, 40, 200), (130, 72, 77))


def _factors(kh, generator, in_features, rank, out_features, dtype):
    return kh.random_factor(generator, in_features, rank, dtype), kh.random_factor(
        generator, rank, out_features, dtype
    )


def _reference(x, u_t, v_t):
    return torch_ref.lowrank_linear(x.double(), u_t.double(), v_t.double())


@pytest.mark.parametrize("schedule", ["fused", "two_stage"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 3, 17, 130])
def test_matches_float64_reference(kh, tokens, dtype, shape, schedule):
    generator = torch.Generator().manual_seed(tokens * 1000 + shape[1])
    u_t, v_t = _factors(kh, generator, *shape, dtype)
    x = kh.random_input(generator, (tokens, shape[0]), dtype)
    y = lowrank_linear(x, u_t, v_t, schedule=schedule)
    assert y.dtype == dtype
    kh.assert_close_to_reference(y, _reference(x, u_t, v_t), f"{schedule} M={tokens} {dtype}")


def _strided_cases(kh, generator, dtype):
    """(name, x, u_t, v_t) with leading batch dims, transposed and sliced views of x and the factors."""
    in_features, rank, out_features = 96, 24, 77
    u_t, v_t = _factors(kh, generator, in_features, rank, out_features, dtype)
    batch = kh.random_input(generator, (2, 9, in_features), dtype)
    yield "batch (B, T, in)", batch, u_t, v_t
    yield "transposed batch (T, B, in)", batch.transpose(0, 1), u_t, v_t
    yield "x.T of (in, M)", kh.random_input(generator, (in_features, 20), dtype).t(), u_t, v_t
    yield "every other column", kh.random_input(generator, (5, 2 * in_features), dtype)[:, ::2], u_t, v_t
    u_transposed = kh.random_factor(generator, rank, in_features, dtype).t()
    v_sliced = kh.random_factor(generator, rank, 2 * out_features, dtype)[:, 1::2]
    yield (
        "transposed u_t, sliced v_t",
        kh.random_input(generator, (3, 4, in_features), dtype),
        u_transposed,
        v_sliced,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batch_dims_and_non_contiguous_views(kh, dtype):
    generator = torch.Generator().manual_seed(7)
    for name, x, u_t, v_t in _strided_cases(kh, generator, dtype):
        for schedule in (None, "two_stage"):
            y = lowrank_linear(x, u_t, v_t, schedule=schedule)
            assert y.shape == (*x.shape[:-1], v_t.shape[1]), name
            kh.assert_close_to_reference(y, _reference(x, u_t, v_t), f"{name}, schedule {schedule}")


def test_no_tokens_gives_an_empty_result(kh):
    generator = torch.Generator().manual_seed(3)
    u_t, v_t = _factors(kh, generator, 32, 8, 20, torch.float32)
    y = lowrank_linear(torch.empty(2, 0, 32, device=kh.device), u_t, v_t)
    assert y.shape == (2, 0, 20)


def test_tolerance_is_tight_enough_to_catch_a_dropped_rank_component(kh):
    """Each dtype's tolerance must reject an answer that misses one of 40 rank components."""
    generator = torch.Generator().manual_seed(11)
    for dtype in DTYPES:
        u_t, v_t = _factors(kh, generator, 96, 40, 200, dtype)
        x = kh.random_input(generator, (17, 96), dtype)
        y = lowrank_linear(x, u_t, v_t)
        assert kh.tolerance_ratio(y, _reference(x, u_t, v_t)) <= 1.0
        assert kh.tolerance_ratio(y, _reference(x, u_t[:, :-1], v_t[:-1])) > 1.0, dtype


def test_default_schedule_under_the_interpreter():
    assert configs.linear_schedule(16, 96, 40, 200, torch.float16, 1, interpreted=True) == "two_stage"
    assert configs.linear_schedule(17, 96, 40, 200, torch.float16, 1, interpreted=True) == "fused"
    assert configs.linear_schedule(130, 96, 300, 200, torch.float16, 1, interpreted=True) == "two_stage"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_tiles_are_legal_for_an_h200(dtype):
    """The GPU configs (not exercised on CPU) keep Triton's rules and the shared-memory budget."""
    h200_sms = 132
    for m in (1, 7, 16, 17, 512, 2048, 8192):
        for k, n in ((4096, 14336), (14336, 1911), (576, 335), (96, 200)):
            tiles = configs.matmul_tiles(m, n, k, dtype, h200_sms, interpreted=False)
            for block in (tiles.block_m, tiles.block_n, tiles.block_k):
                assert block >= 16 and block & (block - 1) == 0
            stage_bytes = (tiles.block_m * tiles.block_k + tiles.block_k * tiles.block_n) * dtype.itemsize
            assert stage_bytes * tiles.num_stages <= 227 * 1024
            if m <= configs.DECODE_MAX_TOKENS and n >= 16 * h200_sms:
                assert triton.cdiv(n, tiles.block_n) >= h200_sms  # every SM streams weights
            fused = configs.fused_linear_tiles(m, k, 200, n, dtype, h200_sms, interpreted=False)
            if fused is not None:
                assert fused.rank_pad <= configs.FUSED_MAX_RANK[dtype] and fused.n_splits >= 1
    assert configs.linear_schedule(1, 4096, 200, 4096, dtype, h200_sms, interpreted=False) == "two_stage"
    assert configs.linear_schedule(8192, 4096, 1911, 4096, dtype, h200_sms, interpreted=False) == "two_stage"


def test_kernels_use_only_triton_builtins():
    """Standard-library helpers (tl.zeros, tl.cdiv...) are @triton.jit functions that break the
    interpreter when Triton was imported before TRITON_INTERPRET was set (see kernels.common)."""
    import triton.language as tl

    used = set()
    for path in Path(common.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tl":
                used.add(node.attr)
    assert "dot" in used
    assert not {name for name in used if isinstance(getattr(tl, name, None), triton.runtime.JITFunction)}


def test_rejects_mismatched_inputs(kh):
    generator = torch.Generator().manual_seed(5)
    u_t, v_t = _factors(kh, generator, 32, 8, 20, torch.float32)
    x = kh.random_input(generator, (4, 32), torch.float32)
    with pytest.raises(ValueError, match=r"x.shape\[-1\] \(31\) must equal u_t.shape\[0\] \(32\)"):
        lowrank_linear(x[:, :31], u_t, v_t)
    with pytest.raises(ValueError, match=r"u_t.shape\[1\] \(rank\) \(8\) must equal v_t.shape\[0\] \(7\)"):
        lowrank_linear(x, u_t, v_t[:7])
    with pytest.raises(ValueError, match="v_t has dtype torch.float16 but x has torch.float32"):
        lowrank_linear(x, u_t, v_t.half())
    with pytest.raises(ValueError, match="x has dtype torch.float64"):
        lowrank_linear(x.double(), u_t.double(), v_t.double())
    with pytest.raises(ValueError, match="u_t must be 2-D"):
        lowrank_linear(x, u_t[None], v_t)
    with pytest.raises(ValueError, match="v_t is on meta"):
        lowrank_linear(x, u_t, v_t.to("meta"))
    with pytest.raises(ValueError, match="unknown schedule"):
        lowrank_linear(x, u_t, v_t, schedule="fast")


def test_compiled_kernels_refuse_cpu_tensors():
    def kernel_body(x_ptr):
        pass

    compiled = triton.runtime.JITFunction(kernel_body)
    with pytest.raises(ValueError, match="need CUDA tensors"):
        check_device("lowrank_linear", torch.zeros(2), compiled)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_realistic_shapes(kh, cuda_only, dtype):
    """Native 16-bit tensor-core dots, both schedules, shapes of a 1B-parameter model's MLP."""
    generator = torch.Generator().manual_seed(0)
    for rank in (200, 1000):  # fits the fused budget (16-bit); does not
        u_t, v_t = _factors(kh, generator, 2048, rank, 8192, dtype)
        for tokens in (1, 16, 100, 2048, 8192):
            x = kh.random_input(generator, (tokens, 2048), dtype)
            expected = _reference(x, u_t, v_t)
            schedules = ["two_stage"]
            if configs.fused_linear_tiles(tokens, 2048, rank, 8192, dtype, 132, interpreted=False):
                schedules.append("fused")
            for schedule in schedules:
                y = lowrank_linear(x, u_t, v_t, schedule=schedule)
                kh.assert_close_to_reference(y, expected, f"{schedule} M={tokens} r={rank}")
