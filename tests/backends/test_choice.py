"""The measured choice between the fused kernels and the unfused chain (timings faked on CPU)."""

from __future__ import annotations

import pytest
import torch

from svdmlp.backends import choice


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(choice, "_CHOICES", {})
    measured = []

    def fake_seconds(run, device_time):
        measured.append((run, device_time))
        return run()

    monkeypatch.setattr(choice, "_seconds", fake_seconds)
    return measured


def test_the_faster_path_is_chosen_once_per_key(fresh):
    paths = {"fused": lambda: 2.0, "unfused": lambda: 1.0}
    assert choice.choose(("k",), paths, device_time=True) == "unfused"
    assert choice.choose(("k",), paths, device_time=True) == "unfused"
    assert len(fresh) == 2  # both measured once, then the cached choice
    assert choice.choices() == {("k",): "unfused"}
    assert (
        choice.choose(("other",), {"fused": lambda: 1.0, "unfused": lambda: 3.0}, device_time=False)
        == "fused"
    )
    assert [device_time for _, device_time in fresh] == [True, True, False, False]


def test_inside_a_graph_capture_the_default_runs_and_nothing_is_decided(fresh, monkeypatch):
    monkeypatch.setattr(choice, "_capturing", lambda: True)
    assert choice.choose(("k",), {"fused": lambda: 2.0, "unfused": lambda: 1.0}, device_time=True) == "fused"
    assert fresh == [] and choice.choices() == {}


@pytest.mark.parametrize(("tokens", "expected"), [(1, 16), (16, 16), (17, 32), (128, 128), (129, 256)])
def test_token_buckets(tokens, expected):
    assert choice.bucket(tokens) == expected


@pytest.mark.parametrize(
    ("leading", "graphed"), [((1,), True), ((4, 4), True), ((17,), False), ((2, 512), False)]
)
def test_decode_calls_are_chosen_by_device_time_and_larger_ones_by_the_eager_callers(leading, graphed):
    """Decode calls are replayed from graphs (the host's queueing paid once); larger ones run eagerly.
    Timed eagerly at decode, the first device run chose the unfused chain on the host's pace."""
    assert choice._graphed(choice.bucket(choice._tokens(torch.ones(*leading, 8)))) is graphed


def test_off_cuda_the_fused_kernels_run_unmeasured(fresh, monkeypatch):
    from svdmlp import kernels

    calls = []
    monkeypatch.setattr(kernels, "lowrank_gated_mlp", lambda *args: calls.append(args) or args[0])
    x = torch.ones(3, 4)
    assert choice.lowrank_gated_mlp(x, *(torch.ones(1, 1),) * 5, "silu") is x
    assert len(calls) == 1 and fresh == []


def test_quantized_factors_take_the_quantized_kernels_at_decode_and_the_unfused_chain_above(
    fresh, monkeypatch
):
    from svdmlp import kernels
    from svdmlp.backends import torch_ref
    from svdmlp.int_weights import SCHEMES, QuantizedMatrix

    calls = []
    monkeypatch.setattr(kernels, "quantized_gated_mlp", lambda *args: calls.append("fused") or args[0])
    monkeypatch.setattr(torch_ref, "lowrank_gated_mlp", lambda *args: calls.append("unfused") or args[0])
    monkeypatch.setattr(torch_ref, "lowrank_linear", lambda *args: calls.append("linear") or args[0])
    factor = QuantizedMatrix.of(torch.ones(4, 4), SCHEMES["int8"])
    for tokens in (16, 17):
        x = torch.ones(tokens, 4)
        assert choice.lowrank_gated_mlp(x, *(factor,) * 5, "silu") is x
    assert choice.lowrank_linear(x, factor, factor) is x  # each factor by its own kernel, at any size
    assert calls == ["fused", "unfused", "linear"] and fresh == []
