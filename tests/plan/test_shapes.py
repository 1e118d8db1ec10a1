"""Model shapes: the built-in table, Hub-style ids, local config.json files, and clear errors."""

import json

import pytest

from svdmlp.plan.shapes import resolve_shapes


def test_builtin_names_aliases_and_groups():
    assert [s.name for s in resolve_shapes("default")] == ["smollm2-135m"]
    assert len(resolve_shapes("paper")) == 6
    (shape,) = resolve_shapes("meta-llama/Llama-3.2-1B")
    assert (shape.hidden, shape.intermediate, shape.layers) == (2048, 8192, 16)
    (qwen,) = resolve_shapes("Qwen3-8B")
    assert (qwen.hidden, qwen.intermediate, qwen.layers, qwen.model_type) == (4096, 12288, 36, "qwen3")
    (coder,) = resolve_shapes("qwen2.5-coder-0.5b")  # svdmlp's second built-in model
    assert (coder.hidden, coder.intermediate, coder.layers) == (896, 4864, 24)


def test_local_model_directory(tmp_path):
    config = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (shape,) = resolve_shapes(str(tmp_path))
    assert (shape.name, shape.hidden, shape.intermediate, shape.layers) == (tmp_path.name, 64, 256, 2)


def test_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        resolve_shapes("no-such-model")
    with pytest.raises(ValueError, match="no config.json"):
        resolve_shapes(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="intermediate_size"):
        resolve_shapes(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        resolve_shapes(str(tmp_path))


def test_every_built_in_model_has_its_shape():
    """``svdmlp plan NAME`` knows each model ``svdmlp compress NAME`` takes."""
    from svdmlp import models

    for name in models.PACKAGED:
        assert resolve_shapes(name), name
    (gemma,) = resolve_shapes("gemma-3-270m")
    assert (gemma.hidden, gemma.intermediate, gemma.layers) == (640, 2048, 18)
