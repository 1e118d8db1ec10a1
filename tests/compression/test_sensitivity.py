"""Per-layer divergences (the exact KL of one factorised layer, weights always put back) and the
ranks allocated from them."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

from conftest import ARCH_CONFIGS, VOCAB, tiny_model
from svdmlp import arch, decompose
from svdmlp.compression import layer_inputs, sensitivity

NAMES = ("gate", "up", "down")


def _setup(model_type="llama"):
    model = tiny_model(model_type)
    spec = arch.of_model(model)
    windows = torch.randint(0, VOCAB, (3, 17), generator=torch.Generator().manual_seed(1))
    return model, spec, windows


def _truncated(model, spec, rank):
    def factorise(index):
        return {
            n: decompose.plain_svd(arch.dense_projection(model, spec, index, n).weight, rank) for n in NAMES
        }

    return factorise


def _reference_kl(model, spec, windows, index, factors) -> float:
    """The KL by hand, in float64: a copy of the model with the layer's weights replaced."""
    probed = copy.deepcopy(model).double()
    for name, pair in factors.items():
        linear = arch.dense_projection(probed, spec, index, name)
        linear.weight.data = pair.v.double() @ pair.u.double()
    with torch.no_grad():
        p = torch.log_softmax(model.double()(input_ids=windows).logits, -1)
        q = torch.log_softmax(probed(input_ids=windows).logits, -1)
    model.float()
    return float((p.exp() * (p - q)).sum(-1).mean())


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_divergence_of_each_layer_matches_a_hand_computation(model_type):
    model, spec, windows = _setup(model_type)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    factorise = _truncated(model, spec, 8)
    probe = sensitivity.Probe(model, spec, windows)
    for index in (0, 1):
        measured = probe.divergence(index, factorise(index))
        assert measured > 0
        expected = _reference_kl(model, spec, windows, index, factorise(index))
        assert measured == pytest.approx(expected, rel=1e-3, abs=1e-7)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name  # every weight put back exactly
    assert _computes_again(model, spec)


def _computes_again(model, spec) -> bool:
    """No decoder layer is left replaying recorded outputs: each runs its own forward again."""
    return all("forward" not in vars(layer) for layer in arch.decoder_layers(model, spec))


def test_exact_factors_cost_nothing():
    model, spec, windows = _setup()
    measured = sensitivity.Probe(model, spec, windows).divergence(1, _truncated(model, spec, 64)(1))
    assert measured == pytest.approx(0.0, abs=1e-6)


def test_weights_are_put_back_when_the_probe_fails():
    model, spec, windows = _setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    good = _truncated(model, spec, 8)(0)
    broken = {"gate": good["gate"], "up": good["down"], "down": good["down"]}  # up gets down's shape
    with pytest.raises(RuntimeError):
        sensitivity.Probe(model, spec, windows).divergence(1, broken)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert _computes_again(model, spec)


def test_one_block_of_the_probed_log_probabilities_is_alive_at_a_time(monkeypatch):
    # Each block is (rows × vocab) float32, 80 MB at Qwen's vocabulary: the logits it came from and the
    # block before it must be gone when the next block's logits are made.
    model, spec, windows = _setup()
    monkeypatch.setattr(layer_inputs, "LOGIT_BLOCK_BYTES", 4 * model.config.vocab_size * 4)
    made, alive_at = [], []
    by_rows = sensitivity.logits_by_rows

    def watched(model, hidden):
        for positions, logits in by_rows(model, hidden):
            gc.collect()
            alive_at.append(sum(ref() is not None for ref in made))
            made.append(weakref.ref(logits))
            yield positions, logits
            del logits

    blocks = sensitivity.log_prob_blocks

    def recorded(*args):
        for block in blocks(*args):
            made.append(weakref.ref(block))
            yield block
            del block

    monkeypatch.setattr(sensitivity, "logits_by_rows", watched)
    probe = sensitivity.Probe(model, spec, windows)
    made.clear()  # the probe's dense blocks are kept on purpose
    alive_at.clear()
    monkeypatch.setattr(sensitivity, "log_prob_blocks", recorded)
    probe.divergence(1, _truncated(model, spec, 8)(1))
    assert len(alive_at) > 2 and alive_at == [0] * len(alive_at)


def test_block_kl_sums_over_aligned_blocks_and_refuses_misaligned_ones():
    p = torch.log_softmax(torch.randn(5, 7, dtype=torch.float64), -1)
    q = torch.log_softmax(torch.randn(5, 7, dtype=torch.float64), -1)
    expected = float((p.exp() * (p - q)).sum())
    assert sensitivity.block_kl([p[:3], p[3:]], iter([q[:3], q[3:]])) == pytest.approx(expected)
    with pytest.raises(ValueError, match="fewer"):
        sensitivity.block_kl([p[:3], p[3:]], iter([q[:3]]))
    with pytest.raises(ValueError, match="more"):
        sensitivity.block_kl([p[:3]], iter([q[:3], q[3:]]))


def test_summed_kl_is_the_formula_to_the_bit_and_distillation_loss_is_its_mean():
    """The probes and distillation share one KL; it must equal the written-out formula exactly, so
    that giving it one home changed no demo digit."""
    from svdmlp.compression.heal.distill import token_kl

    generator = torch.Generator().manual_seed(3)
    student, teacher = (torch.randn(2, 9, 1000, generator=generator) * 3 for _ in range(2))
    p = torch.log_softmax(teacher, -1).flatten(0, -2)
    q = torch.log_softmax(student, -1).flatten(0, -2)
    assert torch.equal(sensitivity.summed_kl(p, q), (p.exp() * (p - q)).sum())
    batchmean = torch.nn.functional.kl_div(q, p, log_target=True, reduction="batchmean")
    assert torch.equal(token_kl(student, teacher), batchmean)
