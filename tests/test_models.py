"""Loading dense models: local directories, refusals before any weight loads, the built-in default."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig, GPT2Config

from conftest import save_tiny_llama, tiny_config, tiny_model
from svdmlp import checkpoint, lazy, models
from svdmlp.compression import pipeline
from svdmlp.config import CompressConfig

DEFAULT_CACHE = ("models", "SmolLM2-135M-Instruct-bf16")


@pytest.fixture
def offline(monkeypatch):
    """No hub request leaves the machine (huggingface_hub reads HF_HUB_OFFLINE when imported)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def no_weight_loading(monkeypatch):
    """Fail the test if anything tries to load weights."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SVDMLP_CACHE", str(root))
    return root


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_dense_local_directory(model_dir, dtype):
    model, tokenizer, location = models.load_dense(str(model_dir), dtype=dtype)
    assert location == str(model_dir)
    assert not model.training
    assert model.config.model_type == "llama"
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    reference = tiny_model("llama").state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reference[name].to(dtype)), name
    assert tokenizer("the quick fox")["input_ids"]


def test_a_model_read_from_disk_keeps_its_generation_settings(tokenizer, tmp_path):
    """Compression reads a local model lazily and its checkpoint saves the model's generation
    config: the publisher's sampling settings (Gemma 3: top-k 64, top-p 0.95) must come through."""

    model = tiny_model("llama")
    model.generation_config = GenerationConfig(do_sample=True, top_k=7, top_p=0.9)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _, _ = models.load_lazy(str(tmp_path))
    settings = loaded.generation_config
    assert (settings.do_sample, settings.top_k, settings.top_p) == (True, 7, 0.9)


def test_unsupported_architecture_is_refused_before_weights_load(tmp_path, no_weight_loading):
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported model type 'gpt2'; svdmlp supports: gemma, .*llama"):
        models.load_dense(str(tmp_path))


def test_unexpected_activation_is_refused_before_weights_load(tmp_path, no_weight_loading):
    tiny_config("llama", hidden_act="gelu").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model type 'llama' with activation 'gelu' is not supported"):
        models.load_dense(str(tmp_path))


def test_directory_without_config(tmp_path, no_weight_loading):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"is not a Hugging Face model directory \(no config.json\)"):
        models.load_dense(str(tmp_path))


# --- weights that do not fit the architecture, or cannot be read ---------------------------------


def _refusal(location) -> str:
    """The one-line message of the ValueError that load_dense raises for ``location``."""
    with pytest.raises(ValueError) as error:
        models.load_dense(str(location))
    message = str(error.value)
    assert "\n" not in message
    return message


def _rewrite_weights(directory, change) -> None:
    """Apply ``change`` to the tensors of ``directory``'s model.safetensors and save them back."""
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def _without_quantization_config(directory) -> None:
    """``directory``'s config.json as svdmlp wrote it before format 4 (checks of its hash aside)."""
    path = directory / "config.json"
    record = json.loads(path.read_text())
    del record["quantization_config"], record["transformers_weights"]
    path.write_text(json.dumps(record))


def test_compressed_checkpoint_without_its_metadata_is_refused(tokenizer, tmp_path):
    model = tiny_model("llama")
    config = CompressConfig(keep=0.5, align=8, method="svd")
    report = pipeline.compress(model, tokenizer, config, progress=False)
    ckpt = checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    assert _refusal(ckpt) == (
        f"{ckpt} is an svdmlp checkpoint, not a dense model: compress its base model, or load it with svdmlp.load"
    )
    copy = tmp_path / "copy"  # as save_pretrained of a compressed model writes it
    shutil.copytree(ckpt, copy)
    (copy / "svdmlp.json").unlink()
    assert "holds an svdmlp-compressed model (quant_method 'svdmlp' in its config.json)" in _refusal(copy)

    _without_quantization_config(ckpt)  # a checkpoint made before format 4
    message = _refusal(ckpt)
    assert message.startswith(f"the weights of {ckpt} do not match the llama architecture of its config: ")
    assert (
        "it is an svdmlp checkpoint, not a dense model: compress its base model, "
        "or load it with svdmlp.checkpoint.load" in message
    )

    (ckpt / "svdmlp.json").unlink()  # transformers would load it as dense, with random MLPs
    message = _refusal(ckpt)
    assert (
        "6 missing (model.layers.0.mlp.down_proj.weight, model.layers.0.mlp.gate_proj.weight, "
        "model.layers.0.mlp.up_proj.weight and 3 more), 10 unexpected (model.layers.0.mlp.down_u_t, "
        "model.layers.0.mlp.down_v_t, model.layers.0.mlp.gate_up_u_t and 7 more); "
        "this looks like an svdmlp checkpoint whose svdmlp.json is missing: restore svdmlp.json, "
        "or compress the base model again"
    ) in message


def test_partially_compressed_checkpoint_without_its_metadata_is_refused(tokenizer, tmp_path):
    model = tiny_model("llama")
    config = CompressConfig(keep=0.5, align=8, method="svd", targets=("down",))
    report = pipeline.compress(model, tokenizer, config, progress=False)
    ckpt = checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    _without_quantization_config(ckpt)  # a checkpoint made before format 4
    (ckpt / "svdmlp.json").unlink()
    message = _refusal(ckpt)
    assert "2 missing (model.layers.0.mlp.down_proj.weight, model.layers.1.mlp.down_proj.weight)" in message
    assert "4 unexpected (model.layers.0.mlp.down_proj.u_t, model.layers.0.mlp.down_proj.v_t, " in message
    assert "this looks like an svdmlp checkpoint whose svdmlp.json is missing" in message


def test_missing_tensor_is_refused(tokenizer, tmp_path):
    directory = save_tiny_llama(tmp_path / "model", tokenizer)  # untied: lm_head.weight is stored
    _rewrite_weights(directory, lambda tensors: tensors.pop("lm_head.weight"))
    assert _refusal(directory) == (
        f"the weights of {directory} do not match the llama architecture of its config: "
        "1 missing (lm_head.weight); the weights file is incomplete or belongs to another model"
    )


def test_unexpected_tensor_is_refused(tokenizer, tmp_path):
    directory = save_tiny_llama(tmp_path / "model", tokenizer)
    _rewrite_weights(directory, lambda tensors: tensors.update({"model.extra.weight": torch.zeros(2, 2)}))
    assert "do not match the llama architecture of its config: 1 unexpected (model.extra.weight); " in (
        _refusal(directory)
    )


def test_tensor_of_another_shape_is_refused(tokenizer, tmp_path):
    directory = save_tiny_llama(tmp_path / "model", tokenizer)
    shapes = {"model.layers.0.mlp.up_proj.weight": (10, 64), "model.layers.1.mlp.up_proj.weight": (96, 8)}
    _rewrite_weights(
        directory, lambda tensors: tensors.update({k: torch.zeros(v) for k, v in shapes.items()})
    )
    assert (
        "2 of another shape (model.layers.0.mlp.up_proj.weight 10x64 instead of 96x64, "
        "model.layers.1.mlp.up_proj.weight 96x8 instead of 96x64); "
        "the weights file is incomplete or belongs to another model"
    ) in _refusal(directory)


@pytest.mark.parametrize(("model_type", "head_stored"), [("gemma", False), ("llama", False), ("llama", True)])
def test_tied_weights_are_not_missing(tokenizer, tmp_path, model_type, head_stored):
    """A tied LM head is stored once (transformers 5.17 reports it neither missing nor unexpected,
    and neither a file that stores it twice)."""
    source = tiny_model(model_type, tie_word_embeddings=True)
    source.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    if head_stored:
        head = {"lm_head.weight": source.get_input_embeddings().weight.detach().clone()}
        _rewrite_weights(tmp_path / "model", lambda tensors: tensors.update(head))
    assert ("lm_head.weight" in load_file(tmp_path / "model" / "model.safetensors")) == head_stored
    model, _, _ = models.load_dense(str(tmp_path / "model"))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert torch.equal(model.get_input_embeddings().weight, source.get_input_embeddings().weight)


@pytest.mark.parametrize(
    ("kept", "reason"),
    [(0.5, "incomplete metadata, file not fully covered"), (0.0, "header too small")],
)
def test_truncated_weights_are_refused(model_dir, kept, reason):
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * kept)])
    assert _refusal(model_dir) == (
        f"model weights {weights} cannot be read (Error while deserializing header: {reason}); "
        "the file is truncated or damaged: save, convert or download the model again"
    )


def test_truncated_shard_is_named(tokenizer, tmp_path):
    directory = tmp_path / "sharded"
    tiny_model("llama").save_pretrained(directory, max_shard_size="150KB")
    tokenizer.save_pretrained(directory)
    shards = sorted(directory.glob("*.safetensors"))
    assert len(shards) > 2
    shards[1].write_bytes(shards[1].read_bytes()[:1000])
    assert _refusal(directory).startswith(f"model weights {shards[1]} cannot be read (")


def test_missing_weights_file_is_refused(model_dir):
    (model_dir / "model.safetensors").unlink()
    assert _refusal(model_dir).startswith(
        f"could not read the weights of model {model_dir}: Error no file named model.safetensors"
    )


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth"])
def test_a_directory_of_pickled_weights_is_refused_before_anything_loads(model_dir, name, no_weight_loading):
    """Issue 52, item 7: a pickle can run code as it loads; svdmlp reads safetensors only."""
    weights = load_file(model_dir / "model.safetensors")
    (model_dir / "model.safetensors").unlink()
    torch.save(weights, model_dir / name)
    for load in (models.load_config, models.load_dense, models.load_lazy):
        with pytest.raises(ValueError, match=f"holds pickled weights only \\({name}\\), and svdmlp loads"):
            load(str(model_dir))


def test_safetensors_are_loaded_where_a_pickle_lies_beside_them(model_dir):
    torch.save({"model.embed_tokens.weight": torch.zeros(1)}, model_dir / "pytorch_model.bin")
    model, _, _ = models.load_dense(str(model_dir))
    expected = load_file(model_dir / "model.safetensors")["model.embed_tokens.weight"]
    assert torch.equal(model.model.embed_tokens.weight, expected)


@pytest.mark.parametrize("name", ["org/no-such-model", "no-such-model"])
def test_hub_id_while_offline(offline, name):
    with pytest.raises(ValueError) as error:
        models.load_dense(name)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"could not load model {name!r}: it is not a local directory and the Hugging Face hub could not provide it ("
    )


def _hub_config(monkeypatch, files: Path) -> None:
    """The hub id "org/tiny" has the config of the model in ``files``."""
    load_config = models.load_config

    def config(name):
        return ("org/tiny", load_config(str(files))[1]) if name == "org/tiny" else load_config(name)

    monkeypatch.setattr(models, "load_config", config)


def _hub_serving(monkeypatch, files: Path) -> list[dict]:
    """The hub id "org/tiny" is the model in ``files``, which snapshot_download fetches; the keyword
    arguments of each download are appended to the list returned."""
    import huggingface_hub

    _hub_config(monkeypatch, files)
    downloads = []

    def snapshot_download(repo_id, **kwargs):
        assert repo_id == "org/tiny"
        downloads.append(kwargs)
        return str(files)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return downloads


def test_a_hub_model_is_downloaded_then_compressed_from_disk(model_dir, monkeypatch, tmp_path):
    # Loaded whole, a hub model's weights and calibration outgrow the memory a local model's need.
    downloads = _hub_serving(monkeypatch, model_dir)
    model, _ = models.load_for_compression("org/tiny", torch.float32, "cpu", tmp_path / "scratch")
    assert downloads == [{"allow_patterns": models.HUB_FILES}]
    assert not any(pattern.endswith((".bin", ".pt", ".pth", ".pkl")) for pattern in models.HUB_FILES)
    assert lazy.of(model) is not None  # read from disk, one unit at a time
    dense = models.load_dense(str(model_dir))[0]
    with lazy.held(model, *lazy.of(model).units):
        for (name, expected), (_, got) in zip(
            dense.state_dict().items(), model.state_dict().items(), strict=True
        ):
            torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=name)


def test_a_hub_model_without_safetensors_weights_is_refused(model_dir, monkeypatch, tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((model_dir / "config.json").read_text())
    _hub_serving(monkeypatch, pickled)
    with pytest.raises(ValueError, match="'org/tiny' has no safetensors weights on the Hugging Face hub"):
        models.load_for_compression("org/tiny", torch.float32, "cpu", tmp_path / "scratch")


def test_a_hub_model_not_in_the_cache_while_offline_is_refused(offline, model_dir, monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _hub_config(monkeypatch, model_dir)  # the hub's own snapshot_download, offline, with an empty cache
    with pytest.raises(
        ValueError, match=r"^could not download model 'org/tiny' from the Hugging Face hub \("
    ):
        models.load_for_compression("org/tiny", torch.float32, "cpu", tmp_path / "scratch")


@pytest.mark.parametrize("relative", ["./missing", "missing/", "a/b/c", "~/../no-such-home-dir"])
def test_missing_paths(tmp_path, monkeypatch, relative):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"model directory {relative} does not exist"):
        models.load_dense(relative)
    absolute = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=f"model directory {absolute} does not exist"):
        models.load_dense(str(absolute))
