import pytest

from svdmlp.config import FORMAT_VERSION, CalibrationSpec, CompressConfig


def test_defaults_and_round_trip():
    config = CompressConfig(keep=0.6, align=16, method="svd", targets=("down", "gate"), layers=(3, 1, 3))
    assert config.targets == ("gate", "down")  # canonical order
    assert config.layers == (1, 3)
    data = config.to_dict()
    assert data["format_version"] == FORMAT_VERSION
    assert CompressConfig.from_dict(data) == config


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        CompressConfig().keep = 0.5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"keep": 0.0}, r"keep must be in \(0, 1\]"),
        ({"keep": 1.01}, r"keep must be in \(0, 1\]"),
        ({"align": 0}, "align must be an integer >= 1"),
        ({"align": 2.5}, "align must be an integer >= 1"),
        ({"method": "asvd"}, "unknown method 'asvd'"),
        ({"targets": ("gate", "o_proj")}, "targets must be distinct names"),
        ({"targets": ()}, "targets must be distinct names"),
        ({"layers": (-1,)}, "layers must be a non-empty list"),
    ],
)
def test_invalid_configs_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompressConfig(**kwargs)


def test_keep_must_be_a_number():
    with pytest.raises(TypeError, match="keep must be a number"):
        CompressConfig(keep="0.8")


@pytest.mark.parametrize("kwargs", [{"num_samples": 0}, {"seq_len": 1}, {"source": ""}])
def test_invalid_calibration(kwargs):
    with pytest.raises(ValueError, match="calibration"):
        CalibrationSpec(**kwargs)


def test_from_dict_rejects_unknown_version_and_keys():
    data = CompressConfig().to_dict()
    with pytest.raises(ValueError, match="format_version"):
        CompressConfig.from_dict({**data, "format_version": 99})
    with pytest.raises(ValueError, match="unknown config keys"):
        CompressConfig.from_dict({**data, "bogus": 1})
