"""The fused low-rank gated MLP against a float64 evaluation of the torch reference."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from svdmlp.backends import torch_ref
from svdmlp.kernels import common, configs, lowrank_gated_mlp
from svdmlp.kernels.gated_expand import _gated_expand_kernel
from svdmlp.kernels.lowrank_linear import _lowrank_linear_kernel
from svdmlp.kernels.matmul import _matmul_kernel

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ACTIVATIONS = ("silu", "gelu_tanh")


def make_mlp(kh, generator, hidden, inter, r_gate, r_up, r_down, dtype):
    """Factors of a random low-rank gated MLP, in the kernels' layout."""
    return dict(
        gate_up_u_t=kh.random_factor(generator, hidden, r_gate + r_up, dtype),
        gate_v_t=kh.random_factor(generator, r_gate, inter, dtype),
        up_v_t=kh.random_factor(generator, r_up, inter, dtype),
        down_u_t=kh.random_factor(generator, inter, r_down, dtype),
        down_v_t=kh.random_factor(generator, r_down, hidden, dtype),
    )


def reference(x, factors, activation):
    return torch_ref.lowrank_gated_mlp(
        x.double(), **{k: v.double() for k, v in factors.items()}, activation=activation
    )


@pytest.mark.parametrize("schedule", ["decode", "prefill"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 3, 17, 130])
def test_matches_float64_reference(kh, tokens, dtype, activation, schedule):
    # hidden 130, inter 77: not multiples of any block; ranks 24, 40, 72: not powers of two.
    generator = torch.Generator().manual_seed(tokens)
    factors = make_mlp(kh, generator, 130, 77, 24, 40, 72, dtype)
    x = kh.random_input(generator, (tokens, 130), dtype)
    y = lowrank_gated_mlp(x, **factors, activation=activation, schedule=schedule)
    assert y.dtype == dtype
    kh.assert_close_to_reference(y, reference(x, factors, activation), f"{schedule} M={tokens}")


@pytest.mark.parametrize("schedule", ["decode", "prefill"])
def test_batch_dims_and_non_contiguous_views(kh, schedule):
    generator = torch.Generator().manual_seed(21)
    factors = make_mlp(kh, generator, 96, 200, 40, 24, 40, torch.float16)
    factors["gate_v_t"] = kh.random_factor(generator, 40, 400, torch.float16)[:, ::2]  # strided factor
    batch = kh.random_input(generator, (3, 6, 96), torch.float16)
    for name, x in (
        ("(B, T, in)", batch),
        ("(T, B, in) view", batch.transpose(0, 1)),
        ("every other token", batch[:, ::2]),
    ):
        y = lowrank_gated_mlp(x, **factors, activation="gelu_tanh", schedule=schedule)
        assert y.shape == x.shape
        kh.assert_close_to_reference(y, reference(x, factors, "gelu_tanh"), name)
    wide = kh.random_input(generator, (96, 11), torch.float16).t()  # (11, 96) with strides (1, 11)
    y = lowrank_gated_mlp(wide, **factors, activation="silu", schedule=schedule)
    kh.assert_close_to_reference(y, reference(wide, factors, "silu"), "transposed x")


def count_launches(monkeypatch):
    """Count kernel launches (every `kernel[grid](...)` goes through `kernel.run`) and library GEMMs."""
    launches = []
    for kernel in (_matmul_kernel, _gated_expand_kernel, _lowrank_linear_kernel):
        original_run = kernel.run

        def counted_run(*args, _run=original_run, _name=kernel.fn.__name__, **kwargs):
            launches.append(_name)
            return _run(*args, **kwargs)

        monkeypatch.setattr(kernel, "run", counted_run)
    original_library = common.library_matmul

    def counted_library(*args):
        launches.append("library_matmul")
        return original_library(*args)

    monkeypatch.setattr(common, "library_matmul", counted_library)
    return launches


@pytest.mark.parametrize(("tokens", "r_down"), [(3, 40), (40, 40), (40, 300)])
def test_launches_per_mlp(kh, monkeypatch, tokens, r_down):
    """Decode: 3 Triton launches. Prefill: the shrink by the library, the gated expand, then the down
    projection in one fused launch when its rank fits on chip (else two library GEMMs)."""
    generator = torch.Generator().manual_seed(tokens + r_down)
    factors = make_mlp(kh, generator, 64, 48, 24, 40, r_down, torch.float32)
    x = kh.random_input(generator, (tokens, 64), torch.float32)
    launches = count_launches(monkeypatch)
    y = lowrank_gated_mlp(x, **factors, activation="silu")
    if tokens <= configs.DECODE_MAX_TOKENS:
        assert launches == ["_matmul_kernel", "_gated_expand_kernel", "_matmul_kernel"]
    else:
        interpreted = kh.device.type == "cpu"
        down = configs.linear_schedule(
            tokens, 48, r_down, 64, x.dtype, configs.sm_count(x.device), interpreted
        )
        if interpreted:
            assert down == ("fused" if r_down <= configs.INTERPRET_FUSED_MAX_RANK else "two_stage")
        down_launches = ["_lowrank_linear_kernel"] if down == "fused" else ["library_matmul"] * 2
        assert launches == ["library_matmul", "_gated_expand_kernel", *down_launches]
    kh.assert_close_to_reference(y, reference(x, factors, "silu"), f"M={tokens} r_down={r_down}")


def test_tolerance_is_tight_enough_to_catch_swapped_activation_or_rank(kh):
    generator = torch.Generator().manual_seed(4)
    for dtype in DTYPES:
        factors = make_mlp(kh, generator, 130, 77, 24, 40, 72, dtype)
        x = kh.random_input(generator, (17, 130), dtype)
        y = lowrank_gated_mlp(x, **factors, activation="silu")
        assert kh.tolerance_ratio(y, reference(x, factors, "silu")) <= 1.0
        assert kh.tolerance_ratio(y, reference(x, factors, "gelu_tanh")) > 1.0, dtype
        truncated = dict(factors, down_u_t=factors["down_u_t"][:, :-1], down_v_t=factors["down_v_t"][:-1])
        assert kh.tolerance_ratio(y, reference(x, truncated, "silu")) > 1.0, dtype


def test_no_tokens_gives_an_empty_result(kh):
    generator = torch.Generator().manual_seed(2)
    factors = make_mlp(kh, generator, 32, 40, 8, 8, 8, torch.float32)
    y = lowrank_gated_mlp(torch.empty(0, 32, device=kh.device), **factors, activation="silu")
    assert y.shape == (0, 32)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(activation="relu"), "unknown activation 'relu'"),
        (
            dict(x=lambda f: f[..., :31]),
            r"x.shape\[-1\] \(hidden\) \(31\) must equal gate_up_u_t.shape\[0\] \(32\)",
        ),
        (dict(gate_up_u_t=lambda f: f[:, :-1]), r"gate_up_u_t.shape\[1\] \(15\) must equal r_gate \+ r_up"),
        (
            dict(up_v_t=lambda f: f[:, :-1]),
            r"gate_v_t.shape\[1\] \(inter\) \(40\) must equal up_v_t.shape\[1\] \(39\)",
        ),
        (dict(down_u_t=lambda f: f[:-1]), r"down_u_t.shape\[0\] \(39\) must equal inter"),
        (
            dict(down_v_t=lambda f: f[:-1]),
            r"down_u_t.shape\[1\] \(rank\) \(8\) must equal down_v_t.shape\[0\] \(7\)",
        ),
        (dict(down_v_t=lambda f: f[:, :-1]), r"down_v_t.shape\[1\] \(31\) must equal hidden"),
        (dict(up_v_t=lambda f: f.half()), "up_v_t has dtype torch.float16 but x has torch.float32"),
        (dict(down_u_t=lambda f: f.to("meta")), "down_u_t is on meta"),
    ],
)
def test_rejects_mismatched_inputs(kh, change, message):
    generator = torch.Generator().manual_seed(8)
    arguments = dict(make_mlp(kh, generator, 32, 40, 8, 8, 8, torch.float32), activation="silu")
    arguments["x"] = kh.random_input(generator, (4, 32), torch.float32)
    for name, value in change.items():
        arguments[name] = value(arguments[name]) if callable(value) else value
    with pytest.raises(ValueError, match=message):
        lowrank_gated_mlp(**arguments)


def test_kernels_compile_for_an_h200_without_spills():
    """Ahead-of-time compile (ptxas ships with Triton, no GPU needed) of the decode and prefill
    launches with the tiles chosen for an H200: what the interpreter cannot check."""
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "svdmlp.kernels.aot", "--quick"]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    kernels = ("_matmul_kernel", "_gated_expand_kernel", "_lowrank_linear_kernel")
    for kernel in kernels + ("_quantized_matmul_kernel", "_quantized_gated_expand_kernel"):
        assert kernel in result.stdout
    for correction in ("CORRECTION=16", "CORRECTION=8"):  # a quantized weight with its correction in one pass
        assert correction in result.stdout


def test_the_l2_prefetch_share_is_off_by_default_and_checked(monkeypatch):
    """``SVDMLP_PREFETCH``: a share of the weight rows, asked for only by a dependent launch whose
    rows are contiguous; anything but a number in [0, 1] is refused with the variable's name."""
    monkeypatch.delenv("SVDMLP_PREFETCH", raising=False)
    assert configs.prefetch_rows(1280, dependent=True, contiguous=True) == 0
    monkeypatch.setenv("SVDMLP_PREFETCH", "0.5")
    assert configs.prefetch_rows(1280, dependent=True, contiguous=True) == 640
    assert configs.prefetch_rows(1280, dependent=False, contiguous=True) == 0
    assert configs.prefetch_rows(1280, dependent=True, contiguous=False) == 0
    for bad in ("1.5", "-0.1", "half"):
        monkeypatch.setenv("SVDMLP_PREFETCH", bad)
        with pytest.raises(ValueError, match="SVDMLP_PREFETCH must be"):
            configs.prefetch_rows(1280, dependent=True, contiguous=True)


@pytest.mark.gpu
@pytest.mark.parametrize("share", ["0.5", "1"])
def test_gpu_decode_with_the_l2_prefetch(kh, cuda_only, monkeypatch, share):
    """The prefetch is a hint: with it the decode chain's output is the reference's."""
    monkeypatch.setenv("SVDMLP_PREFETCH", share)
    generator = torch.Generator().manual_seed(0)
    factors = make_mlp(kh, generator, 2048, 8192, 1280, 1280, 1280, torch.bfloat16)
    for tokens in (1, 16):
        x = kh.random_input(generator, (tokens, 2048), torch.bfloat16)
        y = lowrank_gated_mlp(x, **factors, activation="silu", schedule="decode")
        kh.assert_close_to_reference(y, reference(x, factors, "silu"), f"prefetch {share} M={tokens}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_realistic_shapes(kh, cuda_only, dtype):
    """Native 16-bit dots and real atomics, shapes of Llama-3.2-1B's MLP at keep ≈ 0.6."""
    generator = torch.Generator().manual_seed(0)
    factors = make_mlp(kh, generator, 2048, 8192, 984, 984, 984, dtype)
    for tokens in (1, 16, 100, 2048):
        x = kh.random_input(generator, (tokens, 2048), dtype)
        expected = reference(x, factors, "silu")
        for schedule in ("decode", "prefill"):
            y = lowrank_gated_mlp(x, **factors, activation="silu", schedule=schedule)
            kh.assert_close_to_reference(y, expected, f"{schedule} M={tokens}")
