"""The Triton kernels, reached through the backend registry, compute what the "torch" backend computes."""

from __future__ import annotations

import pytest
import torch

from svdmlp import backends


def test_triton_backend_is_available_here(kh):
    # Under the interpreter (CPU) or on a GPU, asking for "triton" explicitly must work.
    assert backends.resolve("triton", kh.device) == "triton"
    assert backends.get("triton").name == "triton"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [2, 33])
def test_triton_ops_match_torch_ops(kh, dtype, tokens):
    triton_ops, torch_ops = backends.get("triton"), backends.get("torch")
    generator = torch.Generator().manual_seed(tokens)
    hidden, inter = 72, 100
    x = kh.random_input(generator, (1, tokens, hidden), dtype)
    u_t, v_t = kh.random_factor(generator, hidden, 20, dtype), kh.random_factor(generator, 20, inter, dtype)
    expected = torch_ops.lowrank_linear(x.double(), u_t.double(), v_t.double())
    kh.assert_close_to_reference(triton_ops.lowrank_linear(x, u_t, v_t), expected, "linear")
    kh.assert_close_to_reference(torch_ops.lowrank_linear(x, u_t, v_t), expected, "torch linear")

    factors = (
        kh.random_factor(generator, hidden, 16 + 24, dtype),
        kh.random_factor(generator, 16, inter, dtype),
        kh.random_factor(generator, 24, inter, dtype),
        kh.random_factor(generator, inter, 36, dtype),
        kh.random_factor(generator, 36, hidden, dtype),
    )
    for activation in ("silu", "gelu_tanh"):
        expected = torch_ops.lowrank_gated_mlp(x.double(), *(f.double() for f in factors), activation)
        actual = triton_ops.lowrank_gated_mlp(x, *factors, activation)
        kh.assert_close_to_reference(actual, expected, f"gated mlp {activation}")
        # The two backends agree with each other, not only with float64.
        kh.assert_close_to_reference(
            actual, torch_ops.lowrank_gated_mlp(x, *factors, activation).to(dtype).double()
        )
