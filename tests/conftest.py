"""Shared fixtures: tiny random models of every supported architecture, a tiny tokenizer, text.

Everything is built offline from configs; nothing is downloaded.
"""

from __future__ import annotations

import os

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

VOCAB = 320
HIDDEN, INTER, LAYERS = 64, 96, 2

# model_type -> extra config kwargs; every supported architecture of svdmlp.arch.
ARCH_CONFIGS = {
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16},
}

SAMPLE_TEXT = " ".join(
    f"the {adj} {noun} {verb} over the {adj2} hill number {i}."
    for i, (adj, noun, verb, adj2) in enumerate(
        zip(
            ["quick", "lazy", "brave", "quiet", "old", "young", "red", "pale"] * 40,
            ["fox", "dog", "king", "queen", "ghost", "sailor", "clown", "witch"] * 40,
            ["jumps", "walks", "speaks", "sings", "runs", "sleeps", "falls", "waits"] * 40,
            ["green", "dark", "high", "far", "cold", "bright", "long", "wet"] * 40,
            strict=True,
        )
    )
)


def tiny_config(model_type: str, **overrides):
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **ARCH_CONFIGS[model_type],
    )
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_model(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A random model whose MLP inputs are far from white (so whitening has something to do)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides), dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on SAMPLE_TEXT, small enough for VOCAB."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 8, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]
    )
    backend.train_from_iterator([SAMPLE_TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "calib.txt"
    path.write_text(SAMPLE_TEXT, encoding="utf-8")
    return path


@pytest.fixture
def model_dir(tmp_path, tokenizer):
    """A saved tiny Llama (config + safetensors + tokenizer), as a user's local model directory."""
    path = tmp_path / "tiny-llama"
    tiny_model("llama").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
