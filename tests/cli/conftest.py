"""Fixtures of the command-line tests: a compressed tiny checkpoint, CPU defaults, no network."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
import torch

from conftest import SAMPLE_TEXT, tiny_checkpoint


@pytest.fixture(autouse=True)
def _cpu_defaults(monkeypatch):
    """The same defaults (CPU, float32) on every machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def offline(monkeypatch):
    """Make sure no hub request leaves the machine (huggingface_hub reads the env var at import)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def compressed(tmp_path_factory, tokenizer):
    """``svdmlp compress`` run once on a tiny Llama directory: (model_dir, text_file, checkpoint)."""
    return tiny_checkpoint(tmp_path_factory.mktemp("cli"), tokenizer)


@pytest.fixture
def wikitext(tmp_path):
    """A local WikiText-2 copy as the loader accepts it: a parquet file with a ``text`` column."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("datasets")
    path = tmp_path / "wikitext-test.parquet"
    pd.DataFrame({"text": [f" {sentence}. " for sentence in SAMPLE_TEXT.split(".")]}).to_parquet(path)
    return path
