"""The gate nonlinearities every backend and the compression share."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from svdmlp.activations import ACTIVATIONS, activate, check_activation


def test_silu_and_gelu_tanh():
    x = torch.linspace(-4, 4, 33, dtype=torch.float64)
    torch.testing.assert_close(activate(x, "silu"), x * torch.sigmoid(x))
    gelu = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    torch.testing.assert_close(activate(x, "gelu_tanh"), gelu)
    assert not torch.equal(activate(x, "gelu_tanh"), F.gelu(x))  # the tanh form, not the exact erf one


def test_unknown_activation_names_the_known_ones():
    assert ACTIVATIONS == ("silu", "gelu_tanh")
    with pytest.raises(ValueError, match=r"lowrank_gated_mlp: unknown activation 'relu'; expected one of"):
        check_activation("relu", "lowrank_gated_mlp")
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        activate(torch.zeros(2), "relu")
