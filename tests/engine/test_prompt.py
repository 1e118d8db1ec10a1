"""Prompts as the model expects them: Gemma's start with its BOS token, others as their tokenizer says."""

from __future__ import annotations

import pytest

from conftest import tiny_model
from svdmlp.engine.prompt import encode


def test_gemma_prompts_start_with_bos_and_llama_prompts_as_the_tokenizer_gives_them(tokenizer):
    plain = tokenizer("the quick fox")["input_ids"]
    for model_type in ("gemma", "gemma2", "gemma3_text"):
        assert encode(tiny_model(model_type), tokenizer, "the quick fox") == [tokenizer.bos_token_id, *plain]
    assert encode(tiny_model("llama"), tokenizer, "the quick fox") == plain


def test_a_prompt_that_already_starts_with_bos_gets_no_second_one(tokenizer):
    ids = encode(tiny_model("gemma2"), tokenizer, "<bos>the quick fox")
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id


def test_chat_needs_a_chat_template(tokenizer):
    with pytest.raises(ValueError, match="no chat template; drop --chat"):
        encode(tiny_model("llama"), tokenizer, "hello", chat=True)
