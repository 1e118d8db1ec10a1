import pytest
import torch
import torch.nn.functional as F

from svdmlp.backends import torch_ref


def _factors(rows, cols, generator):
    return torch.randn(rows, cols, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_mlp_equals_dense_mlp_with_product_weights(activation):
    g = torch.Generator().manual_seed(0)
    hidden, inter, rg, ru, rd = 12, 20, 5, 7, 6
    gate_u, gate_v = _factors(rg, hidden, g), _factors(inter, rg, g)
    up_u, up_v = _factors(ru, hidden, g), _factors(inter, ru, g)
    down_u, down_v = _factors(rd, inter, g), _factors(hidden, rd, g)
    x = torch.randn(2, 3, hidden, generator=g, dtype=torch.float64)
    act = F.silu if activation == "silu" else (lambda t: F.gelu(t, approximate="tanh"))
    expected = F.linear(act(F.linear(x, gate_v @ gate_u)) * F.linear(x, up_v @ up_u), down_v @ down_u)
    got = torch_ref.lowrank_gated_mlp(
        x, torch.cat([gate_u.T, up_u.T], dim=1), gate_v.T, up_v.T, down_u.T, down_v.T, activation
    )
    torch.testing.assert_close(got, expected)


def test_lowrank_linear_is_the_product():
    g = torch.Generator().manual_seed(1)
    u, v, x = _factors(4, 9, g), _factors(11, 4, g), torch.randn(3, 9, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch_ref.lowrank_linear(x, u.T, v.T), x @ (v @ u).T)


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        torch_ref.activate(torch.zeros(2), "relu")
