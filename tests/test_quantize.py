"""Fake quantization of a model's MLP for evaluation: dense weights and low-rank factors, along their sums."""

from __future__ import annotations

import torch

from conftest import tiny_model
from svdmlp import arch
from svdmlp.int_weights import SCHEMES, dequantize, quantize
from svdmlp.quantize import quantize_mlp


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


def test_fake_quantized_factors_compute_what_stored_quantized_factors_compute():
    """``eval --quantize`` on a checkpoint scores exactly the model ``compress --factor-bits`` stores."""
    import copy

    from svdmlp.bench.e2e import install_random_lowrank
    from svdmlp.int_weights import SCHEMES
    from svdmlp.lowrank import lowrank_modules

    fake = tiny_model("qwen2")
    install_random_lowrank(fake, keep=0.5, align=8, backend="torch")
    stored = copy.deepcopy(fake)
    quantize_mlp(fake, "int4")
    for module in lowrank_modules(stored):
        module.quantize_factors(SCHEMES["int4"])
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        torch.testing.assert_close(stored(ids).logits, fake(ids).logits, rtol=1e-5, atol=1e-6)


def test_a_model_on_disk_is_quantized_as_the_same_model_in_memory(tokenizer, tmp_path):
    from conftest import save_tiny_llama
    from svdmlp import lazy, models

    save_tiny_llama(tmp_path / "model", tokenizer)
    (tmp_path / "scratch").mkdir()
    on_disk, _, _ = models.load_lazy(str(tmp_path / "model"), scratch=tmp_path / "scratch")
    in_memory, _, _ = models.load_dense(str(tmp_path / "model"))
    assert quantize_mlp(on_disk, "int4") == quantize_mlp(in_memory, "int4")
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 11, 2]])
    with torch.no_grad():  # each layer was written back rounded: the next forward reads it so
        assert torch.equal(on_disk(ids).logits, in_memory(ids).logits)
    assert len(lazy.of(on_disk).stored) == len(arch.decoder_layers(on_disk, arch.of_model(on_disk)))
