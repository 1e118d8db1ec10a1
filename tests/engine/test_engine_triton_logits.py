"""Under the Triton interpreter: a compressed model's logits at every decoding step, Triton backend
against the PyTorch backend (prefill above 16 tokens, then one-token decode steps at batch 2)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

from conftest import compress_for_generation, untied_model
from svdmlp.lowrank import lowrank_modules, set_backend

STEPS = 6


def _decode(model, prompt: torch.Tensor, forced: list[torch.Tensor] | None = None):
    """Last-position logits of the prefill and of each decode step, and the tokens fed: greedy, or
    ``forced`` (so that both backends see the same inputs)."""
    cache = DynamicCache(config=model.config)
    fed, steps = [], []
    with torch.no_grad():
        logits = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1]
        for step in range(STEPS):
            steps.append(logits)
            token = logits.argmax(-1) if forced is None else forced[step]
            fed.append(token)
            logits = model(input_ids=token[:, None], past_key_values=cache, use_cache=True).logits[:, -1]
    return steps + [logits], fed


def test_every_step_of_the_triton_backend_matches_the_torch_backend(tokenizer, text_file):
    model = untied_model("llama")
    compress_for_generation(model, tokenizer, text_file)
    prompt = torch.randint(3, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    set_backend(model, "torch")
    reference, tokens = _decode(model, prompt)
    assert set_backend(model, "triton") == "triton"
    assert {module.backend for module in lowrank_modules(model)} == {"triton"}
    result, _ = _decode(model, prompt, forced=tokens)
    for step, (got, expected) in enumerate(zip(result, reference, strict=True)):
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), f"step {step}"
