"""The quantization_config record: written from a checkpoint's report, read back exactly, and anything
this svdmlp cannot build a model from refused with the reason."""

from __future__ import annotations

import json

import pytest

from svdmlp.serving import quant_config
from svdmlp.serving.quant_config import QuantSpec, parse

REPORT = {
    "layers": [
        {"index": 0, "status": "skipped", "projections": []},
        {
            "index": 1,
            "status": "compressed",
            "projections": [{"name": n, "rank": r} for n, r in (("gate", 32), ("up", 32), ("down", 24))],
        },
        {"index": 2, "status": "compressed", "projections": [{"name": "gate", "rank": 16}]},
    ]
}


def test_of_checkpoint_keeps_the_compressed_layers_ranks():
    spec = quant_config.of_checkpoint(REPORT, {"align": 8, "factor_bits": 4})
    assert spec == QuantSpec(
        layers={1: {"gate": 32, "up": 32, "down": 24}, 2: {"gate": 16}}, align=8, factor_bits=4
    )
    assert spec.fully_compressed(1) and not spec.fully_compressed(2) and not spec.fully_compressed(0)


def test_the_record_round_trips_through_json():
    spec = quant_config.of_checkpoint(REPORT, {"align": 8, "factor_bits": 16})
    record = json.loads(json.dumps(spec.to_dict()))
    assert record["quant_method"] == "svdmlp" and record["format_version"] == quant_config.VERSION
    assert parse(record) == spec


def test_the_checkpoint_writes_it(compressed_llama):
    record = json.loads((compressed_llama / "config.json").read_text())
    spec = parse(record["quantization_config"])
    metadata = json.loads((compressed_llama / "svdmlp.json").read_text())
    assert spec == quant_config.of_checkpoint(metadata["report"], metadata["config"])
    assert record["transformers_weights"] == quant_config.WEIGHTS_GUARD
    assert record["architectures"] == ["LlamaForCausalLM"]


@pytest.fixture(scope="module")
def compressed_llama(tmp_path_factory, tokenizer):
    from conftest import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("qc"), tokenizer)[2]


GOOD = QuantSpec(layers={1: {"gate": 32, "up": 32, "down": 24}}, align=8, factor_bits=16).to_dict()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"quant_method": "gptq"}, "not an svdmlp quantization_config"),
        ({"format_version": 6}, "format_version 6; this svdmlp reads 4 or 5"),
        ({"format_version": 5}, "weights must be one of .* in format_version 5 and absent before"),
        ({"weights": "int4"}, "weights must be one of .* in format_version 5 and absent before"),
        ({"format_version": 5, "weights": "int3"}, "weights must be one of"),
        ({"format_version": 5, "weights": "int4", "factor_bits": 5}, "factor_bits must be one of"),
        ({"format_version": "4"}, "format_version '4'"),
        ({"factor_bits": 3}, "factor_bits must be one of"),
        ({"factor_bits": True}, "factor_bits must be one of"),
        ({"align": 0}, "align must be an integer >= 1"),
        ({"layers": [1, 2]}, "layers must map layer indices"),
        ({"layers": {"one": {"gate": 3}}}, "layer 'one' is not a layer index"),
        ({"layers": {"1": {"gate": -3}}}, "layer 1's ranks"),
        ({"layers": {"1": {"gates": 3}}}, "layer 1's ranks"),
        ({"layers": {"1": {}}}, "layer 1's ranks"),
    ],
)
def test_what_cannot_be_built_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        parse({**GOOD, **change})


def test_quantized_weights_round_trip_and_vllm_refuses_partial_corrections():
    report = {
        "layers": [
            {"index": 0, "status": "quantized", "projections": [{"name": "gate", "rank": 16}]},
            {"index": 1, "status": "quantized", "projections": []},
        ]
    }
    spec = quant_config.of_checkpoint(report, {"align": 16, "factor_bits": 16, "quantize": "int4"})
    assert spec == QuantSpec(layers={0: {"gate": 16}}, align=16, factor_bits=16, version=5, weights="int4")
    assert parse(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(ValueError, match="corrects only some projections of layer 0; vLLM serves"):
        spec.require_whole_mlps()
    whole = QuantSpec(
        layers={0: {"gate": 8, "up": 8, "down": 8}}, align=16, factor_bits=8, version=5, weights="int4"
    )
    whole.require_whole_mlps()
    assert parse(whole.to_dict()) == whole


def test_not_a_dict_is_refused():
    with pytest.raises(ValueError, match="not an svdmlp quantization_config"):
        parse("svdmlp")
