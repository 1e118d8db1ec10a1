"""The engine against Hugging Face ``generate`` on tiny random models of every architecture."""

from __future__ import annotations

import pytest
import torch

from conftest import ARCH_CONFIGS, compress_for_generation, hf_greedy, untied_model
from svdmlp.engine import Engine

PROMPT = [5, 17, 42, 99, 7, 3]
NEW = 16


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_greedy_equals_hf_generate(model_type):
    model = untied_model(model_type)
    expected = hf_greedy(model, [PROMPT], NEW)
    assert Engine(model).generate([PROMPT], NEW).tokens == expected


@pytest.mark.parametrize("model_type", ["mistral", "gemma2", "gemma3_text"])
def test_sliding_window_shorter_than_the_text_equals_hf(model_type):
    model = untied_model(model_type, sliding_window=4)
    assert Engine(model).generate([PROMPT], NEW).tokens == hf_greedy(model, [PROMPT], NEW)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma2"])
def test_compressed_model_equals_its_hf_reference(model_type, tokenizer, text_file):
    model = untied_model(model_type)
    compress_for_generation(model, tokenizer, text_file)
    assert Engine(model).generate([PROMPT], NEW).tokens == hf_greedy(model, [PROMPT], NEW)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_batch_of_different_lengths_equals_single_runs(model_type):
    model = untied_model(model_type)
    prompts = [PROMPT, [9, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [300]]
    engine = Engine(model)
    batched = engine.generate(prompts, NEW).tokens
    assert batched == [engine.generate([p], NEW).tokens[0] for p in prompts]
    assert batched == hf_greedy(model, prompts, NEW)


def test_stop_tokens_cut_each_row():
    model = untied_model("llama")
    engine = Engine(model)
    free = engine.generate([PROMPT, [9, 8]], NEW).tokens
    stop = free[0][3]
    stopped = engine.generate([PROMPT, [9, 8]], NEW, stop_tokens={stop}).tokens
    for row, full in zip(stopped, free, strict=True):
        expected = full[: full.index(stop) + 1] if stop in full else full
        assert row == expected
    assert stopped[0] == hf_greedy(model, [PROMPT], NEW, stop=stop)[0]


def test_all_rows_stopped_ends_decoding_early():
    engine = Engine(untied_model("llama"))
    first = engine.generate([PROMPT], 1).tokens[0][0]
    result = engine.generate([PROMPT], NEW, stop_tokens=[first])
    assert result.tokens == [[first]] and result.decode_steps == 0


def test_streaming_delivers_every_token_in_order():
    engine = Engine(untied_model("qwen2"), sync_every=3)
    chunks = []
    result = engine.generate([PROMPT, [4, 4]], 10, on_tokens=chunks.append)
    for row in range(2):
        assert [t for chunk in chunks for t in chunk[row]] == result.tokens[row]
    assert len(chunks) == 1 + 3  # the first token, then 9 decode steps in chunks of 3


def test_sampling_is_reproducible_and_seeded():
    engine = Engine(untied_model("llama"))
    options = {"temperature": 1.5, "seed": 7}
    first = engine.generate([PROMPT, PROMPT], 24, options).tokens
    assert engine.generate([PROMPT, PROMPT], 24, options).tokens == first
    assert first[0] != first[1]  # rows draw their own noise
    assert engine.generate([PROMPT, PROMPT], 24, {**options, "seed": 8}).tokens != first


@pytest.mark.parametrize("options", [{"top_k": 1}, {"top_p": 1e-6}, {"top_k": 3, "top_p": 1e-6}])
def test_top_k_one_or_tiny_top_p_is_greedy(options):
    engine = Engine(untied_model("qwen3"))
    greedy = engine.generate([PROMPT, [9, 8]], NEW).tokens
    sampled = engine.generate([PROMPT, [9, 8]], NEW, {"temperature": 2.0, "seed": 3, **options}).tokens
    assert sampled == greedy


def test_top_k_restricts_the_first_token_to_the_k_most_likely():
    model = untied_model("llama")
    with torch.no_grad():
        top3 = set(model(torch.tensor([PROMPT])).logits[0, -1].topk(3).indices.tolist())
    engine = Engine(model)
    drawn = {
        engine.generate([PROMPT], 1, {"temperature": 5.0, "top_k": 3, "seed": s}).tokens[0][0]
        for s in range(30)
    }
    assert drawn <= top3 and len(drawn) > 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompts": [list(range(1, 250))], "max_new_tokens": 10}, "exceeds the cache limit of 256"),
        ({"prompts": [PROMPT] * 65, "max_new_tokens": 2}, "batch of 65 prompts exceeds the limit of 64"),
        ({"prompts": [PROMPT], "max_new_tokens": 2, "sampling": {"top_z": 3}}, "unknown sampling options"),
        ({"prompts": [PROMPT], "max_new_tokens": 2, "sampling": {"temperature": -1}}, "temperature"),
        ({"prompts": [PROMPT], "max_new_tokens": 2, "sampling": {"top_p": 0.0}}, "top_p must be in"),
        ({"prompts": [PROMPT], "max_new_tokens": 2, "sampling": {"top_p": 1.5}}, "top_p must be in"),
        ({"prompts": [PROMPT], "max_new_tokens": 2, "sampling": {"top_k": 0}}, "top_k must be >= 1"),
        ({"prompts": [PROMPT], "max_new_tokens": 2, "sampling": {"top_k": 999}}, "exceeds the vocabulary"),
        ({"prompts": [PROMPT], "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompts": [], "max_new_tokens": 2}, "no prompts"),
        ({"prompts": [PROMPT, []], "max_new_tokens": 2}, "prompts [1] are empty"),
        ({"prompts": [[5, 320]], "max_new_tokens": 2}, "outside the vocabulary"),
    ],
)
def test_bad_input_is_a_clear_value_error(kwargs, message):
    engine = Engine(untied_model("llama"))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        engine.generate(**kwargs)
    assert engine.generate([PROMPT], 2).tokens  # the engine still works afterwards


def test_bad_engine_options_are_value_errors():
    model = untied_model("llama")
    with pytest.raises(ValueError, match="max_batch"):
        Engine(model, max_batch=65)
    with pytest.raises(ValueError, match="graphs=True needs a model on CUDA"):
        Engine(model, graphs=True)
    with pytest.raises(ValueError, match="sync_every"):
        Engine(model, sync_every=-1)
