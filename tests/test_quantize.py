"""Round-to-nearest quantization: the error bound, exact round trips, packed bytes, bad weights."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from svdmlp import arch
from svdmlp.quantize import SCHEMES, dequantize, quantize, quantize_mlp, scheme


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("shape", [(7, 300), (33, 128), (1, 5)])
def test_every_weight_is_within_half_a_scale(name, shape):
    how = SCHEMES[name]
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(shape[1])) * 0.02
    q, scales = quantize(weight, how)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= how.qmax
    restored = dequantize(q, scales, shape)
    group = shape[1] if how.group is None else how.group
    per_weight = scales.float().expand(-1, -1, group).reshape(shape[0], -1)[:, : shape[1]]
    assert ((restored - weight).abs() <= per_weight / 2 * (1 + 1e-3)).all()


def test_values_on_the_grid_round_trip_exactly():
    how = SCHEMES["int4"]
    q = torch.randint(-7, 8, (3, 256), generator=torch.Generator().manual_seed(0)).float()
    q[:, 0], q[:, 128] = 7, 7  # each group's largest magnitude sets its scale to 1/8 exactly
    weight = q / 8
    restored = dequantize(*quantize(weight, how), tuple(weight.shape))
    assert torch.equal(restored, weight)


def test_packed_bytes_count_values_and_scales():
    assert SCHEMES["int8"].nbytes(4096, 14336) == 4096 * 14336 + 4096 * 2
    assert SCHEMES["int4"].nbytes(4096, 14336) == 4096 * 14336 // 2 + 4096 * 112 * 2
    assert SCHEMES["int4"].nbytes(3, 130) == -(-3 * 130 // 2) + 3 * 2 * 2


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        scheme("int3")
    with pytest.raises(ValueError, match="NaN or infinite"):
        quantize(torch.tensor([[1.0, float("nan")]]), SCHEMES["int8"])
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.ones(3), SCHEMES["int8"])


def test_the_mlp_is_quantized_in_place_and_the_rest_untouched():
    model = tiny_model("llama")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    info = quantize_mlp(model, "int8")
    spec = arch.of_model(model)
    gate = arch.dense_projection(model, spec, 0, "gate").weight
    q, scales = quantize(
        before[next(n for n in before if n.endswith("layers.0.mlp.gate_proj.weight"))], SCHEMES["int8"]
    )
    assert torch.equal(gate, dequantize(q, scales, tuple(gate.shape)))
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all(".mlp." in name for name in changed)
    assert 0 < info["max_rel_error"] < 0.02 and info["mlp_bytes"] < info["mlp_bytes_bf16"] / 1.9


def test_a_compressed_model_has_its_factors_quantized_along_their_sums():
    from svdmlp.bench.e2e import install_random_lowrank
    from svdmlp.lowrank import lowrank_modules

    model = tiny_model("llama")
    install_random_lowrank(model, keep=0.5, align=8, backend="torch")
    module = lowrank_modules(model)[0]
    down_u_t = module.down_u_t.detach().clone()  # (inter, r): each of r outputs sums over inter inputs
    info = quantize_mlp(model, "int4")
    q, scales = quantize(down_u_t.T, SCHEMES["int4"])
    assert torch.equal(module.down_u_t, dequantize(q, scales, (down_u_t.shape[1], down_u_t.shape[0])).T)
    factors = sum(p.numel() for m in lowrank_modules(model) for p in m.parameters())
    assert info["mlp_bytes_bf16"] == 2 * factors and info["mlp_bytes"] < info["mlp_bytes_bf16"] / 3


def test_the_command_line_offers_every_scheme():
    """``eval --quantize`` lists its choices without importing torch; they must stay the schemes."""
    import argparse

    from svdmlp.cli import evaluate

    parser = argparse.ArgumentParser()
    evaluate.add_parser(parser.add_subparsers())
    action = next(
        a for a in parser._subparsers._group_actions[0].choices["eval"]._actions if a.dest == "quantize"
    )
    assert sorted(action.choices) == sorted(SCHEMES)
