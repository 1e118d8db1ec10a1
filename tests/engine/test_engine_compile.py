"""The compiled decode step (torch.compile, full graph, static shapes) decodes as Hugging Face does."""

from __future__ import annotations

import warnings

import pytest
import torch

from conftest import hf_greedy, tiny_model
from svdmlp import lowrank
from svdmlp.bench.e2e import install_random_lowrank
from svdmlp.engine import Engine
from svdmlp.int_weights import SCHEMES


def test_the_compiled_step_of_a_low_rank_model_equals_hf_greedy():
    model = tiny_model("llama")
    install_random_lowrank(model, keep=0.5, align=8, backend="torch")
    prompts = [[5, 9, 3, 12, 7], [4, 4, 8]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = Engine(model, max_batch=2, max_seq_len=64, compile=True).generate(prompts, 10)
    assert result.compiled and result.note is None  # a failure would only warn and decode eagerly
    ours = [str(w.message) for w in caught if "svdmlp" in w.filename or "lru_cache" in str(w.message)]
    assert ours == []
    assert result.tokens == hf_greedy(model, prompts, 10)


@pytest.mark.parametrize("scheme", [None, "int8", "int4"])
def test_the_compiled_step_runs_the_triton_backend_as_one_opaque_op(scheme):
    """Traced, the Triton launchers broke the full graph and the engine decoded eagerly (the device run
    of session 16); as custom ops they compile, float and quantized factors alike (kernels interpreted)."""
    model = tiny_model("llama")
    install_random_lowrank(model, keep=0.5, align=8, backend="triton")
    if scheme is not None:
        for module in lowrank.lowrank_modules(model):
            module.quantize_factors(SCHEMES[scheme])
    prompts = [[5, 9, 3, 12, 7]]
    with warnings.catch_warnings(record=True):
        result = Engine(model, max_batch=1, max_seq_len=32, compile=True).generate(prompts, 4)
    assert result.compiled and result.note is None, result.note
    assert result.tokens == hf_greedy(model, prompts, 4)


def test_a_step_that_does_not_compile_decodes_eagerly_and_says_why(monkeypatch):
    model = tiny_model("llama")

    def refuse(step, **options):
        def fail():
            raise RuntimeError("no compiler here")

        return fail

    monkeypatch.setattr(torch, "compile", refuse)
    prompts = [[5, 9, 3]]
    with warnings.catch_warnings(record=True):
        result = Engine(model, max_batch=1, max_seq_len=32, compile=True).generate(prompts, 6)
    assert not result.compiled and "compiling the decode step failed" in result.note
    assert result.tokens == hf_greedy(model, prompts, 6)
