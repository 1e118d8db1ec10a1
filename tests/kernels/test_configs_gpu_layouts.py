"""The kernels with the block layouts an H200 gets, run under the interpreter against float64.

The other kernel tests run the interpreter's own 64-wide blocks; here the tile functions are told they
are compiled for a GPU of 132 SMs, so the decode layouts (16-row tiles, 128-deep rank steps, the merged
gate/up loop, the down loop's own pipeline), the small-batch layouts and the prefill layouts are the
ones whose values are checked. Shapes are the smallest that still take every loop several times.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from svdmlp.backends import torch_ref
from svdmlp.int_weights import SCHEMES, QuantizedMatrix
from svdmlp.kernels import configs, lowrank_gated_mlp, lowrank_linear, quantized_gated_mlp

H200_SMS = 132
TILE_FUNCTIONS = (
    "matmul_tiles",
    "gated_expand_tiles",
    "quantized_gated_expand_tiles",
    "fused_linear_tiles",
    "linear_schedule",
)


@pytest.fixture
def gpu_layouts(kh, monkeypatch):
    if kh.device.type == "cuda":
        pytest.skip("on a GPU the other kernel tests run these layouts natively")
    monkeypatch.setattr(configs, "sm_count", lambda device: H200_SMS)
    for name in TILE_FUNCTIONS:
        original = getattr(configs, name)
        signature = inspect.signature(original)

        def as_compiled(*args, _original=original, _signature=signature, **kwargs):
            bound = _signature.bind(*args, **kwargs)
            bound.arguments["interpreted"] = False
            return _original(*bound.args, **bound.kwargs)

        monkeypatch.setattr(configs, name, as_compiled)


def mlp(kh, generator, hidden, inter, ranks, dtype):
    r_gate, r_up, r_down = ranks
    return dict(
        gate_up_u_t=kh.random_factor(generator, hidden, r_gate + r_up, dtype),
        gate_v_t=kh.random_factor(generator, r_gate, inter, dtype),
        up_v_t=kh.random_factor(generator, r_up, inter, dtype),
        down_u_t=kh.random_factor(generator, inter, r_down, dtype),
        down_v_t=kh.random_factor(generator, r_down, hidden, dtype),
    )


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("ranks", [(136, 136, 200), (72, 40, 136)], ids=["merged", "apart"])
@pytest.mark.parametrize("tokens", [1, 16, 40, 300])
def test_gated_mlp_with_h200_layouts(kh, gpu_layouts, tokens, ranks, dtype):
    generator = torch.Generator().manual_seed(tokens + ranks[0])
    factors = mlp(kh, generator, 200, 330, ranks, dtype)
    x = kh.random_input(generator, (tokens, 200), dtype)
    expected = torch_ref.lowrank_gated_mlp(
        x.double(), **{k: v.double() for k, v in factors.items()}, activation="silu"
    )
    y = lowrank_gated_mlp(x, **factors, activation="silu")
    kh.assert_close_to_reference(y, expected, f"M={tokens} ranks={ranks}")


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("tokens", [1, 16])
def test_quantized_gated_mlp_with_h200_layouts(kh, gpu_layouts, tokens, dtype, name):
    """Rank steps of 64 (32 in fp32) inside int4's groups of 128, the 16-row tile, the deep down loop."""
    generator = torch.Generator().manual_seed(tokens)
    factors = [
        QuantizedMatrix.of(factor.float(), SCHEMES[name])
        for factor in mlp(kh, generator, 200, 330, (136, 136, 200), torch.float32).values()
    ]
    x = kh.random_input(generator, (tokens, 200), dtype)
    dequantized = [factor.dequantized(torch.float64).T for factor in factors]
    expected = torch_ref.lowrank_gated_mlp(x.double(), *dequantized, "silu")
    y = quantized_gated_mlp(x, *factors, "silu")
    kh.assert_close_to_reference(y, expected, f"{name} M={tokens}")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize(("tokens", "schedule"), [(1, None), (16, "two_stage"), (300, "fused")])
def test_lowrank_linear_with_h200_layouts(kh, gpu_layouts, tokens, schedule, dtype):
    generator = torch.Generator().manual_seed(tokens)
    x = kh.random_input(generator, (tokens, 260), dtype)
    u_t = kh.random_factor(generator, 260, 56, dtype)
    v_t = kh.random_factor(generator, 56, 330, dtype)
    y = lowrank_linear(x, u_t, v_t, schedule=schedule)
    kh.assert_close_to_reference(y, torch_ref.lowrank_linear(x.double(), u_t.double(), v_t.double()))


def test_the_layouts_are_the_gpu_ones(gpu_layouts):
    decode = configs.gated_expand_tiles(1, 330, torch.bfloat16, H200_SMS, True, True)
    assert (decode.block_m, decode.block_r) == (16, 128)
    assert decode.down_stages > decode.num_stages  # the down loop's own, deeper pipeline
    assert configs.gated_expand_tiles(40, 330, torch.bfloat16, H200_SMS, True, False).num_warps == 8
    assert configs.matmul_tiles(1, 330, 200, torch.bfloat16, H200_SMS, True).block_m == 16
    quantized = configs.quantized_gated_expand_tiles(1, 330, torch.bfloat16, 4, H200_SMS, True)
    assert (quantized.block_m, quantized.block_r) == (16, 64)
