"""The journal of a compression on disk: what it refuses. Continuing a stopped run end to end is in
tests/test_lazy.py."""

import pytest
import torch

from svdmlp import lazy
from svdmlp.compression import journal
from svdmlp.compression.calibration import Calibration
from svdmlp.compression.output_grams import OutputGrams
from svdmlp.compression.report import LayerRecord
from svdmlp.config import CalibrationSpec, CompressConfig
from svdmlp.ranks import LayerSensitivity, Spectrum

PLAN = {"model": "m", "config": {"keep": 0.8, "calibration": {"num_samples": 32}}, "dtype": "torch.float32"}


def _config(**changes) -> CompressConfig:
    values = dict(keep=0.8, method="fisher", calibration=CalibrationSpec("general", 8, 64), sequential=True)
    values.update(changes)
    return CompressConfig(**values)


def test_only_plans_that_can_continue_get_a_journal():
    assert journal.resumable(_config())
    assert journal.resumable(_config(method="svd", sequential=False))  # no calibration to walk
    assert not journal.resumable(_config(sequential=False))  # a one-shot walk carries the dense layers
    assert not journal.resumable(_config(factor_bits=8))


def test_a_journal_of_another_plan_or_unreadable_is_refused_and_kept(tmp_path):
    first = journal.Journal(tmp_path, PLAN)
    first.allocated({0: {"gate": 8}}, {"seconds": 1.0})
    other = {**PLAN, "config": {**PLAN["config"], "calibration": {"num_samples": 16}}}
    with pytest.raises(ValueError, match=r"another plan \(config\.calibration\.num_samples: 32 -> 16\)"):
        journal.Journal(tmp_path, other)
    assert journal.Journal(tmp_path, PLAN).allocation() == ({0: {"gate": 8}}, {"seconds": 1.0})
    (tmp_path / journal.JOURNAL_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=f"cannot be read .*delete {tmp_path} to start again"):
        journal.Journal(tmp_path, PLAN)


def _spilled(directory, indices=(0, 1)) -> dict:
    spilled = {}
    for i in indices:
        path = directory / f"g{i}.safetensors"
        lazy.save_atomic({"gate": torch.eye(3) * i}, path, {})
        spilled[i] = OutputGrams(None, None, None, tokens=64, path=path)
    return spilled


@pytest.mark.parametrize("damage", ["deleted", "truncated", "changed", "replaced"])
def test_a_calibration_whose_grams_fail_their_check_is_forgotten_to_be_collected_again(tmp_path, damage):
    record = journal.Journal(tmp_path, PLAN)
    record.calibrated(Calibration({}, 64, "abc", [["general", 1.0]], _spilled(tmp_path)))
    assert sorted(journal.Journal(tmp_path, PLAN).calibration().outputs) == [0, 1]
    path = tmp_path / "g1.safetensors"
    data = path.read_bytes()
    if damage == "deleted":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "changed":
        path.write_bytes(data[:-4] + b"\x01\x02\x03\x04")
    else:  # a whole file, but not the one recorded
        lazy.save_atomic({"gate": torch.ones(3, 3)}, path, {})
    opened = journal.Journal(tmp_path, PLAN)
    assert opened.calibration() is None
    assert opened.notes == ["the calibration's output-gradient Grams failed their check: collected again"]
    assert journal.Journal(tmp_path, PLAN).notes == []  # forgotten on disk too


def test_the_grams_of_layers_done_or_left_dense_are_not_checked(tmp_path):
    record = journal.Journal(tmp_path, PLAN)
    record.calibrated(Calibration({}, 64, "abc", [["general", 1.0]], _spilled(tmp_path)))
    record.allocated({0: {"gate": 8}}, {"seconds": 1.0})  # layer 1 left dense: its Grams are not needed
    (tmp_path / "g1.safetensors").unlink()
    assert sorted(journal.Journal(tmp_path, PLAN).calibration().outputs) == [0, 1]


def _layer_file(directory, index):
    path = directory / f"layer{index}.safetensors"
    lazy.save_atomic({"w": torch.full((4,), float(index))}, path, {})
    return path


@pytest.mark.parametrize("healed", [False, True])
def test_a_layer_whose_file_fails_its_check_is_compressed_again(tmp_path, healed):
    record = journal.Journal(tmp_path, PLAN)
    for index in (0, 1, 2):
        record.stored(LayerRecord(index, f"m.{index}", "compressed"), _layer_file(tmp_path, index))
    if healed:
        record.before_healing()
        for index in (0, 1, 2):  # distillation writes every layer anew
            lazy.save_atomic({"w": torch.full((4,), index + 0.5)}, tmp_path / f"layer{index}.safetensors", {})
        record.healed({"method": "lora"})
        assert not list(tmp_path.glob("*.before"))
    data = (tmp_path / "layer1.safetensors").read_bytes()
    (tmp_path / "layer1.safetensors").write_bytes(data[:-8] + bytes(8))
    opened = journal.Journal(tmp_path, PLAN)
    if healed:  # distillation changed every layer: they and the healing are done again
        assert opened.layers() == {} and opened.healing() is None
        assert opened.notes[0].startswith("the kept file of layer 1 failed its check; distillation")
    else:
        assert sorted(opened.layers()) == [0, 2]
        assert opened.notes == ["the kept file of layer 1 failed its check: compressed again"]
        assert not (tmp_path / "layer1.safetensors").exists()
    assert journal.Journal(tmp_path, PLAN).notes == []


def test_a_calibration_held_in_memory_is_not_recorded(tmp_path):
    record = journal.Journal(tmp_path, PLAN)
    in_memory = Calibration({}, 64, "abc", [], {0: OutputGrams(None, None, None, tokens=64)})
    record.calibrated(in_memory)
    assert record.calibration() is None and record.summary() == ""


def test_measured_sensitivities_read_back_exactly_until_the_allocation_is_recorded(tmp_path):
    energy = torch.rand(7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).sort(
        descending=True
    )[0]
    layer = LayerSensitivity(3, (Spectrum("3.gate", 8, 7, energy),), 0.0123456789012345678, 32)
    record = journal.Journal(tmp_path, PLAN)
    record.measured(layer)
    read = journal.Journal(tmp_path, PLAN).sensitivities()[3]
    assert read.kl == layer.kl and read.reference_rank == 32 and read.spectra[0].name == "3.gate"
    assert torch.equal(read.spectra[0].energy, energy)
    assert journal.Journal(tmp_path, PLAN).summary() == "1 layers' sensitivity"
    record.allocated({3: {"gate": 32}}, {"seconds": 1.0})
    assert journal.Journal(tmp_path, PLAN).sensitivities() == {}


def test_the_steps_seconds_are_kept_with_each_record_and_when_a_run_stops(tmp_path):
    first = journal.Journal(tmp_path, PLAN)
    first.clock.switch("allocation")
    first.allocated({0: {"gate": 8}}, {"seconds": 1.0})
    recorded = journal.Journal(tmp_path, PLAN).clock.totals()
    assert set(recorded) == {"allocation"} and recorded["allocation"] >= 0
    first.clock.switch("factorisation")
    first.stopped()  # the time since the last record, which a stop would otherwise lose
    continued = journal.Journal(tmp_path, PLAN).clock.totals()
    assert continued == first.clock.totals() and set(continued) == {"allocation", "factorisation"}
    assert continued["allocation"] >= recorded["allocation"]


def test_the_factorisation_is_done_once_every_layer_the_allocation_chose_is_stored(tmp_path):
    record = journal.Journal(tmp_path, PLAN)
    assert record.chosen() is None and record.done == []
    record.allocated({3: {"gate": 32}, 5: {"gate": 32}}, {"seconds": 1.0})  # the other layers stay dense
    record.stored(LayerRecord(3, "model.layers.3.mlp", "compressed"), _layer_file(tmp_path, 3))
    assert record.chosen() == 2 and record.done == ["allocation"]
    record.stored(LayerRecord(5, "model.layers.5.mlp", "compressed"), _layer_file(tmp_path, 5))
    assert journal.Journal(tmp_path, PLAN).done == ["allocation", "factorisation"]


def test_a_journal_opened_to_read_finds_the_same_and_changes_nothing_on_disk(tmp_path):
    """What a dry run opens, maybe beside the run that writes the directory: it must not repair."""
    record = journal.Journal(tmp_path, PLAN)
    for index in (0, 1):
        record.stored(LayerRecord(index, f"m.{index}", "compressed"), _layer_file(tmp_path, index))
    record.before_healing()  # distillation stopped after it had rewritten layer 0
    lazy.save_atomic({"w": torch.full((4,), 9.0)}, tmp_path / "layer0.safetensors", {})
    data = (tmp_path / "layer1.safetensors").read_bytes()
    (tmp_path / "layer1.safetensors").write_bytes(data[:-8] + bytes(8))
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    read = journal.Journal(tmp_path, PLAN, repair=False)
    assert sorted(read.layers()) == [0]  # layer 0 as it was before distillation, layer 1 damaged
    assert read.notes == ["the kept file of layer 1 failed its check: compressed again"]
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
    with pytest.raises(ValueError, match="records nothing"):
        read.stopped()
    repaired = journal.Journal(tmp_path, PLAN)  # the run itself puts layer 0 back and drops layer 1
    assert sorted(repaired.layers()) == [0] and not (tmp_path / "layer1.safetensors").exists()
    assert not (tmp_path / "layer0.safetensors.before").exists()
