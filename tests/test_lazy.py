"""Models whose layers stay on disk: the same outputs and the same compression as in memory, one
layer loaded at a time, and nothing half-written when a run stops."""

import gc
import json
import os
import signal
import weakref

import pytest
import torch

from conftest import (
    ARCH_CONFIGS,
    SAMPLE_TEXT,
    VOCAB,
    assert_cli_error,
    backward_stopped_at,
    count_calls,
    forward_stopped_at,
    run_cli,
    snapshot,
    tiny_model,
)
from svdmlp import arch, checkpoint, lazy, models
from svdmlp.cli import main
from svdmlp.compression import correction_ranks, factorise, output_grams, pipeline, sensitivity, sequential
from svdmlp.compression.heal import distill
from svdmlp.config import CalibrationSpec, CompressConfig, LoraSpec
from svdmlp.quantized_linear import QuantizedLinear

IDS = torch.tensor([[1, 5, 9, 14, 3, 7, 11, 2]])


def _saved(model_type, tokenizer, root, **overrides):
    """A tiny model of ``model_type`` saved as a Hugging Face directory, and the model itself."""
    model = tiny_model(model_type, num_hidden_layers=3, **overrides)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return model


def _loaded_elements(model) -> int:
    """Elements of the model's parameters that hold memory of their own (placeholders hold one)."""
    return sum(p.numel() for p in model.parameters() if 0 not in p.stride() or p.dim() == 0)


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_a_model_on_disk_computes_what_it_computes_in_memory(model_type, tokenizer, tmp_path):
    dense = _saved(model_type, tokenizer, tmp_path)
    model, _, _ = models.load_lazy(str(tmp_path))
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, dense(IDS).logits)
    spec = arch.of_model(model)
    units = lazy.of(model).units
    assert len(units) == 5  # the embeddings, three decoder layers, the LM head (tied or not)
    # Between forward passes only the tensors outside the units (the final norm) are in memory.
    in_units = {id(p) for unit in units for p in unit.parameters()}
    outside = sum(p.numel() for p in model.parameters() if id(p) not in in_units)
    assert 0 < _loaded_elements(model) == outside < 200
    with lazy.held(model, arch.decoder_layers(model, spec)[1]):
        weight = arch.dense_projection(model, spec, 1, "gate").weight
        assert torch.equal(weight, arch.dense_projection(dense, spec, 1, "gate").weight)
    assert torch.isnan(arch.dense_projection(model, spec, 1, "gate").weight).all()  # dropped again


def test_a_load_interrupted_midway_leaves_nothing_loaded(tokenizer, tmp_path, monkeypatch, recwarn):
    # Ctrl-C while a layer's weights are read: the interrupt is raised as it is, no half-loaded layer
    # stays in memory, and the model computes as before on the next call.
    dense = _saved("llama", tokenizer, tmp_path)
    model, _, _ = models.load_lazy(str(tmp_path))
    resident = _loaded_elements(model)
    read, calls = lazy.read_tensor, []

    def interrupted(*args):
        calls.append(args)
        if len(calls) == 5:  # inside the first decoder layer, some of its tensors read
            raise KeyboardInterrupt
        return read(*args)

    monkeypatch.setattr(lazy, "read_tensor", interrupted)
    with pytest.raises(KeyboardInterrupt), torch.no_grad():
        model(IDS)
    assert _loaded_elements(model) == resident
    assert not [w for w in recwarn if "forward hook" in str(w.message)]
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, dense(IDS).logits)


def test_tied_weights_stay_one_tensor(tokenizer, tmp_path):
    _saved("gemma", tokenizer, tmp_path)
    model, _, _ = models.load_lazy(str(tmp_path))
    with lazy.held(model, model.get_output_embeddings()):
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        assert not torch.isnan(model.get_input_embeddings().weight).any()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_an_embedding_called_without_gradients_reads_only_its_tokens_rows(tokenizer, tmp_path, monkeypatch):
    # Only the rows of the tokens are read, whatever the padding row (a row of the whole table, here
    # past the rows read); with gradients the table is read whole, as the gradient is the table's.
    pad = VOCAB - 1
    dense = _saved("llama", tokenizer, tmp_path, tie_word_embeddings=False, pad_token_id=pad)
    model, _, _ = models.load_lazy(str(tmp_path))
    embedding = model.get_input_embeddings()
    read_whole, read_rows, whole, rows = lazy.read_tensor, lazy.read_rows, [], []
    monkeypatch.setattr(lazy, "read_tensor", lambda *args: whole.append(args[2]) or read_whole(*args))
    monkeypatch.setattr(lazy, "read_rows", lambda *args: rows.append(args[2]) or read_rows(*args))
    ids = torch.cat([IDS, IDS.flip(1)[:, :3], torch.tensor([[pad]])], dim=1)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, dense(ids).logits)
    assert "model.embed_tokens.weight" not in whole
    assert len(rows) == 1 and torch.equal(rows[0], ids.unique())
    assert torch.isnan(embedding.weight).all() and embedding.padding_idx == pad  # as it was
    whole.clear()
    assert torch.equal(model(ids).logits, dense(ids).logits)
    assert "model.embed_tokens.weight" in whole and len(rows) == 1


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_rows_read_from_disk_are_the_tensor_s_rows(tmp_path, stored):
    from safetensors.torch import save_file

    table = torch.randn(50, 3, 2, generator=torch.Generator().manual_seed(0)).to(stored)
    path = tmp_path / "t.safetensors"
    save_file({"before": torch.ones(7), "t": table, "ints": torch.arange(50)}, path)
    rows = torch.tensor([0, 7, 8, 49])
    for dtype in (torch.float32, torch.bfloat16):
        read = lazy.read_rows(path, "t", rows, dtype, torch.device("cpu"))
        assert read.dtype == dtype and torch.equal(read, table[rows].to(dtype))
    assert lazy.read_rows(path, "ints", rows, torch.float32, torch.device("cpu")) is None  # not floating


def _config(**changes) -> CompressConfig:
    """The default recipe in miniature: fisher, allocation, sequential, closed form, distillation."""
    values = dict(
        keep=0.5,
        align=8,
        method="fisher",
        calibration=CalibrationSpec("text", 4, 32),
        allocation="budget",
        sequential=True,
        heal="closed-form+lora",
        lora=LoraSpec(4, None, 32, relative_lr=1e-3),  # each factor at its own rate
    )
    values.update(changes)
    return CompressConfig(**values)


RECIPES = {
    "default": {},
    "default-resident": {},  # distillation with the model loaded whole
    "no-distillation": {"heal": "closed-form"},
    "one-shot": {"sequential": False, "heal": "none", "allocation": "uniform"},
    "one-shot-allocated": {"sequential": False, "heal": "none", "method": "whiten"},
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_compressing_from_disk_gives_the_factors_compressing_in_memory_gives(tokenizer, tmp_path, recipe):
    in_memory = _saved("qwen2", tokenizer, tmp_path / "model")
    config = _config(**RECIPES[recipe])
    pipeline.compress(in_memory, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    model, _, _ = models.load_lazy(str(tmp_path / "model"), scratch=scratch)
    resident, resident_before = recipe.endswith("resident"), _loaded_elements(model)
    report = pipeline.compress(
        model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False, resident_healing=resident
    )
    if resident:  # loaded for distillation only
        assert _loaded_elements(model) == resident_before
    path = checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    loaded, _ = checkpoint.load(path)
    expected = in_memory.state_dict()
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-4, atol=1e-5, msg=name)
    if recipe == "no-distillation":  # the compressed layers went into the checkpoint as they were written
        layer = checkpoint.read_metadata(path)["weights"]["files"][1]
        assert (path / layer).stat().st_ino == (scratch / layer).stat().st_ino
    with torch.no_grad():  # the model still reads its layers from where they were written
        torch.testing.assert_close(model(IDS).logits, in_memory(IDS).logits, rtol=1e-3, atol=1e-3)


def test_one_layer_of_a_model_on_disk_is_in_memory_at_a_time(tokenizer, tmp_path, monkeypatch):
    _saved("llama", tokenizer, tmp_path / "model")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    model, _, _ = models.load_lazy(str(tmp_path / "model"), scratch=scratch)
    layer_elements = sum(p.numel() for p in arch.decoder_layers(model, arch.of_model(model))[0].parameters())
    embedding = model.get_input_embeddings().weight.numel()
    peak = [0]
    layer = factorise.layer

    def watched(*args, **kwargs):
        peak[0] = max(peak[0], _loaded_elements(model))
        return layer(*args, **kwargs)

    monkeypatch.setattr(factorise, "layer", watched)
    pipeline.compress(
        model, tokenizer, _config(heal="closed-form"), calibration_text=SAMPLE_TEXT, progress=False
    )
    assert 0 < peak[0] <= layer_elements + embedding  # the layer compressed (and the resident norms)
    assert len(list(scratch.iterdir())) == 3  # each layer written as it was made


def test_one_layer_s_grams_and_inputs_are_alive_at_a_time(tokenizer, tmp_path, monkeypatch):
    # A layer's Grams (inter² float64: 0.64 GB at Qwen2.5-Coder-1.5B's width) and closed form's MLP inputs
    # must be freed before the next layer's are made, in the allocation's dense walk and the sequential
    # pass alike, and none may outlive the factorisation into distillation.
    _saved("llama", tokenizer, tmp_path / "model")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    model, _, _ = models.load_lazy(str(tmp_path / "model"), scratch=scratch)
    made, alive_at = [], []
    calibrate = sequential._calibrate_layer

    def alive() -> int:
        gc.collect()
        return sum(ref() is not None for ref in made)

    def watched(*args, **kwargs):
        alive_at.append(alive())
        grams, inputs = calibrate(*args, **kwargs)
        made.extend(weakref.ref(t) for t in [grams.gate_up, grams.down, *(inputs or [])])
        return grams, inputs

    heal = distill.distill

    def healing(*args, **kwargs):
        alive_at.append(alive())
        return heal(*args, **kwargs)

    monkeypatch.setattr(sequential, "_calibrate_layer", watched)
    monkeypatch.setattr(distill, "distill", healing)
    pipeline.compress(model, tokenizer, _config(), calibration_text=SAMPLE_TEXT, progress=False)
    assert len(made) > 2 * 3 * 2  # both walks over the three layers, closed form's inputs kept
    assert alive_at == [0] * 7  # six layer walks, then distillation


def test_the_dense_teacher_keeps_no_layer_loaded(tokenizer, tmp_path, monkeypatch):
    # Compression replaces each held layer's dense projections, which distillation keeps aside as its
    # teacher: they must go back to their placeholders when the layer is let go, though no longer in the model.
    _saved("llama", tokenizer, tmp_path / "model")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    model, _, _ = models.load_lazy(str(tmp_path / "model"), scratch=scratch)
    resident = _loaded_elements(model)
    seen = []
    heal = distill.distill

    def watched(model, teacher, *args, **kwargs):
        with teacher.active():
            seen.append(_loaded_elements(model))
        return heal(model, teacher, *args, **kwargs)

    monkeypatch.setattr(distill, "distill", watched)
    pipeline.compress(model, tokenizer, _config(), calibration_text=SAMPLE_TEXT, progress=False)
    assert seen == [resident]


def _command(root, out, *extra) -> list[str]:
    """``svdmlp compress`` of the tiny model in ``root`` (default recipe, small) into ``out``."""
    command = ["compress", str(root / "model"), "--calib", str(root / "calib.txt"), "--calib-samples", "4"]
    command += ["--calib-seq-len", "32", "--align", "8", "--heal-steps", "2", "--heal-seq-len", "16"]
    return [*command, "--out", str(out), *extra]


def _factors(directory) -> dict[str, torch.Tensor]:
    loaded, _ = checkpoint.load(directory)
    return {name: t for name, t in loaded.state_dict().items() if "mlp" in name}


@pytest.fixture
def saved_model(tokenizer, tmp_path):
    _saved("llama", tokenizer, tmp_path / "model")
    (tmp_path / "calib.txt").write_text(SAMPLE_TEXT)
    return tmp_path


# The dense model's own samples (``self``) must be drawn from the dense model when a run continues too.
@pytest.mark.parametrize(("stop", "source"), [("ctrl-c", "text"), ("sigterm", "text"), ("ctrl-c", "self")])
def test_a_run_stopped_between_layers_keeps_the_previous_checkpoint_and_continues(
    saved_model, monkeypatch, stop, source, capsys
):
    root, out = saved_model, saved_model / "ckpt"
    calib = ["--calib", "self"] if source == "self" else []
    assert main(_command(root, out, "--keep", "0.75", *calib)) == 0
    before = json.loads((out / "svdmlp.json").read_text())
    layer, calls = factorise.layer, []
    monkeypatch.setattr(factorise, "layer", lambda *a, **k: calls.append(a[2]) or layer(*a, **k))
    assert main(_command(root, root / "whole", "--keep", "0.5", *calib)) == 0  # the same run, never stopped
    assert len(calls) == 3

    def stopped(model, spec, index, *args, **kwargs):
        if index == calls[2] and stop == "ctrl-c":
            raise KeyboardInterrupt
        if index == calls[2]:
            os.kill(os.getpid(), signal.SIGTERM)
        return layer(model, spec, index, *args, **kwargs)

    monkeypatch.setattr(factorise, "layer", stopped)
    again = _command(root, out, "--keep", "0.5", "--overwrite", *calib)
    assert main(again) == (130 if stop == "ctrl-c" else 143)
    assert json.loads((out / "svdmlp.json").read_text()) == before
    checkpoint.load(out)  # every file as recorded
    work = root / ".ckpt.work"
    assert "is kept in " + str(work) in capsys.readouterr().err
    stopped_run = json.loads((work / "progress.json").read_text())
    assert sorted(stopped_run["layers"]) == sorted(map(str, calls[:2]))

    journal = (work / "progress.json").read_text()
    code, _, err = run_cli(capsys, *again, "--dry-run")  # predicts what is left, touches nothing
    assert code == 0 and f"the prediction is of what is left by the stopped run in {work}" in err
    assert (work / "progress.json").read_text() == journal

    resumed = []
    monkeypatch.setattr(factorise, "layer", lambda *a, **k: resumed.append(a[2]) or layer(*a, **k))
    code, printed, err = run_cli(capsys, *again)
    assert code == 0, err
    assert f"continuing the stopped run in {work}: calibration, allocation, 2 compressed layers done" in err
    assert resumed == calls[2:]  # only the layer not done
    assert not work.exists()
    # The report counts the stopped run's seconds (recorded as it stopped) with this run's.
    spent = json.loads((out / "svdmlp.json").read_text())["report"]
    assert "s with the stopped runs it continued (calibration" in printed
    for step, seconds in stopped_run["seconds"].items():
        assert spent["timings"][step] >= seconds > 0, step
    assert spent["seconds"] == pytest.approx(sum(spent["timings"].values()))
    whole, continued = _factors(root / "whole"), _factors(out)
    assert whole.keys() == continued.keys()
    for name, tensor in whole.items():
        torch.testing.assert_close(continued[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("allocate", [False, True])
def test_a_quantize_run_stopped_between_layers_continues_to_the_same_checkpoint(
    saved_model, monkeypatch, capsys, allocate
):
    # int4 weights with zero points and an int8 correction: every stored tensor of a layer is a buffer
    root = saved_model
    quantize = ["--quantize", "int4-asym", "--correction-keep", "0.5", "--factor-bits", "8", "--align", "8"]
    quantize += ["--allocate"] * allocate
    calib = ["--calib", str(root / "calib.txt"), "--calib-samples", "4", "--calib-seq-len", "32"]

    def command(out: str) -> list[str]:
        return ["compress", str(root / "model"), *quantize, *calib, "--out", str(root / out)]

    measuring, measured = correction_ranks.allocate, []
    monkeypatch.setattr(
        correction_ranks, "allocate", lambda *a, **k: measured.append(1) or measuring(*a, **k)
    )
    storing, stored, stop_at = QuantizedLinear.rounded.__func__, [], []

    def rounded(cls, *args, **kwargs):  # each projection once rounded; stops the run at one of them
        stored.append(1)
        if len(stored) == (stop_at or [0])[0]:
            raise KeyboardInterrupt
        return storing(cls, *args, **kwargs)

    monkeypatch.setattr(QuantizedLinear, "rounded", classmethod(rounded))
    assert main(command("whole")) == 0  # never stopped
    assert len(stored) == 9 and len(measured) == allocate  # three layers of three projections

    stored.clear()
    stop_at.append(8)  # layer 2's up projection: layers 0 and 1 are stored
    assert main(command("ckpt")) == 130
    work = root / ".ckpt.work"
    assert "is kept in " + str(work) in capsys.readouterr().err
    progress = json.loads((work / "progress.json").read_text())
    assert sorted(progress["layers"]) == sorted(progress["tallies"]) == ["0", "1"]
    assert ("allocation" in progress) == allocate

    stored.clear()
    stop_at.clear()
    code, _, err = run_cli(capsys, *command("ckpt"))
    assert code == 0, err
    done = "allocation, 2 compressed layers" if allocate else "2 compressed layers"
    assert f"continuing the stopped run in {work}: {done} done" in err
    assert len(stored) == 3  # only layer 2's projections
    assert len(measured) == 2 * allocate  # the stopped run's allocation, not this one's
    assert not work.exists()
    whole, continued = (checkpoint.read_metadata(root / name)["report"] for name in ("whole", "ckpt"))
    for key in ("mlp_bytes", "mlp_bytes_bf16", "max_rel_error", "correction_params"):
        assert continued["quantization"][key] == whole["quantization"][key], key
    assert (
        continued["layers"] == whole["layers"]
        and continued["allocation"].keys() == whole["allocation"].keys()
    )
    expected, got = (checkpoint.load(root / name)[0].state_dict() for name in ("whole", "ckpt"))
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_a_run_stopped_in_the_allocation_measures_only_the_layers_left(saved_model, monkeypatch, capsys):
    root = saved_model
    assert main(_command(root, root / "whole")) == 0
    divergence, probed = sensitivity.Probe.divergence, []

    def stopped(self, index, *args, **kwargs):
        probed.append(index)
        if len(probed) == 2:
            raise KeyboardInterrupt
        return divergence(self, index, *args, **kwargs)

    monkeypatch.setattr(sensitivity.Probe, "divergence", stopped)
    assert main(_command(root, root / "ckpt")) == 130
    probed.clear()

    def recorded(self, index, *args, **kwargs):
        probed.append(index)
        return divergence(self, index, *args, **kwargs)

    monkeypatch.setattr(sensitivity.Probe, "divergence", recorded)
    code, _, err = run_cli(capsys, *_command(root, root / "ckpt"))
    assert code == 0, err
    assert "calibration, 1 layers' sensitivity done" in err
    assert probed == [1, 2]  # layer 0 was measured before the stop
    whole, continued = _factors(root / "whole"), _factors(root / "ckpt")
    assert whole.keys() == continued.keys()
    for name, tensor in whole.items():
        torch.testing.assert_close(continued[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_run_stopped_in_its_calibration_continues_from_its_layer(saved_model, monkeypatch, capsys, where):
    root = saved_model
    assert main(_command(root, root / "whole")) == 0
    stop = forward_stopped_at(monkeypatch, 2) if where == "forward" else backward_stopped_at(monkeypatch, 0)
    with stop as ran:
        assert main(_command(root, root / "ckpt")) == 130
    assert ran == ([0, 1] if where == "forward" else [2, 1])
    forward = count_calls(monkeypatch, output_grams, "_forward_and_head")
    layers_kept = count_calls(monkeypatch, output_grams._LayerInputs, "put")
    code, _, err = run_cli(capsys, *_command(root, root / "ckpt"))
    assert code == 0, err
    kept = {"forward": "forward pass up to layer 2", "backward": "backward pass down to layer 1"}[where]
    assert "continuing the stopped run" in err and f"the calibration's {kept}" in err
    # Forward: layer 2's inputs only are kept again; backward: the hidden states and the head's gradient were kept.
    assert (len(forward), len(layers_kept)) == ((1, 1) if where == "forward" else (0, 0))
    whole, continued = _factors(root / "whole"), _factors(root / "ckpt")
    assert whole.keys() == continued.keys()
    for name, tensor in whole.items():
        torch.testing.assert_close(continued[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("where", ["on-disk", "resident"])
def test_a_run_stopped_in_distillation_heals_again_from_the_layers_before_it(
    saved_model, monkeypatch, capsys, where
):
    root = saved_model
    # A tight --max-memory trains the layers on disk, each step rewriting them; else the model is loaded whole.
    extra = ["--max-memory", "2"] if where == "on-disk" else []
    trainer = distill._OnDisk if where == "on-disk" else distill._InMemory
    assert main(_command(root, root / "whole", *extra)) == 0
    step = trainer.step
    steps = []

    def stopped(self, *args, **kwargs):
        steps.append(1)
        if len(steps) == 2:  # after one step has changed every layer
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(trainer, "step", stopped)
    assert main(_command(root, root / "ckpt", *extra)) == 130
    monkeypatch.setattr(trainer, "step", step)
    calls = []
    layer = factorise.layer
    monkeypatch.setattr(factorise, "layer", lambda *a, **k: calls.append(a[2]) or layer(*a, **k))
    code, _, err = run_cli(capsys, *_command(root, root / "ckpt", *extra))
    assert code == 0, err
    assert calls == []  # every layer was done: only the distillation ran again
    whole, continued = _factors(root / "whole"), _factors(root / "ckpt")
    for name, tensor in whole.items():
        torch.testing.assert_close(continued[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_a_stopped_run_of_another_plan_is_neither_continued_nor_lost(saved_model, monkeypatch, capsys):
    root = saved_model
    layer = factorise.layer

    def stopped(model, spec, index, *args, **kwargs):
        if index == 1:
            raise KeyboardInterrupt
        return layer(model, spec, index, *args, **kwargs)

    monkeypatch.setattr(factorise, "layer", stopped)
    assert main(_command(root, root / "ckpt", "--keep", "0.5")) == 130
    work = root / ".ckpt.work"
    kept = snapshot(work)
    capsys.readouterr()
    assert_cli_error(
        capsys,
        "compress",
        _command(root, root / "ckpt", "--keep", "0.75"),
        "holds a stopped compression of another plan (config.keep: 0.5 -> 0.75)",
        f"delete {work}",
    )
    assert snapshot(work) == kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_big_tensor_cast_on_loading_is_read_in_blocks_of_rows_exactly(tmp_path, monkeypatch, dtype):
    from safetensors import safe_open
    from safetensors.torch import save_file

    stored = torch.randn(37, 5, 3, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    path = tmp_path / "t.safetensors"
    save_file({"small": torch.ones(2), "w": stored}, path)
    monkeypatch.setattr(lazy, "READ_BYTES", 100)  # blocks of 3 rows (30 bytes each), the last one short
    with safe_open(path, framework="pt") as handle:
        read = lazy.read_tensor(handle, path, "w", dtype, torch.device("cpu"))
        small = lazy.read_tensor(handle, path, "small", torch.float32, torch.device("cpu"))
    assert read.dtype == dtype and torch.equal(read, stored.to(dtype))
    assert torch.equal(small, torch.ones(2))


def test_factors_quantized_from_disk_go_into_their_layers_files(tokenizer, tmp_path):
    _saved("qwen2", tokenizer, tmp_path / "model")
    config = _config(heal="closed-form", factor_bits=8)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    model, _, _ = models.load_lazy(str(tmp_path / "model"), scratch=scratch)
    report = pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    assert report.quantization["scheme"] == "int8"
    path = checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    index = json.loads((path / lazy.INDEX_FILE).read_text())["weight_map"]
    compressed = [r.index for r in report.layers if r.status == "compressed"]
    assert compressed
    for i in compressed:
        assert index[f"model.layers.{i}.mlp.down_u_t.values"] == lazy.shard_name(i + 1, 5)
    loaded, _ = checkpoint.load(path)
    with torch.no_grad():  # the checkpoint computes what the model on disk computes
        assert torch.equal(loaded(IDS).logits, model(IDS).logits)
