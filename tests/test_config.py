import pytest

from svdmlp.config import (
    CALIB_TOKENS_PER_WIDTH,
    EFFORTS,
    FORMAT_VERSION,
    CalibrationSpec,
    CompressConfig,
    LoraSpec,
    parse_mixture,
)


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


def test_keep_below_the_floor_is_refused():
    """Issue 52, item 8: keep 1e-9 silently achieved 0.076 (the ranks' floor of one --align block)."""
    with pytest.raises(ValueError, match="keep 1e-09 is below 0.01: the ranks cannot go under one block"):
        CompressConfig(keep=1e-9)
    assert CompressConfig(keep=0.01).keep == 0.01


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


@pytest.mark.parametrize(
    "source, expected",
    [
        ("shakespeare", (("shakespeare", 1.0),)),
        ("a.txt:3, shakespeare:1", (("a.txt", 0.75), ("shakespeare", 0.25))),
        ("gsm8k,notes.txt", (("gsm8k", 0.5), ("notes.txt", 0.5))),
        ("C:\\data\\notes.txt:1", (("C:\\data\\notes.txt", 1.0),)),  # only a numeric suffix is a weight
        ("dir:with:colons/x.txt", (("dir:with:colons/x.txt", 1.0),)),
    ],
)
def test_calibration_mixtures_parse_and_normalise(source, expected):
    assert parse_mixture(source) == expected


@pytest.mark.parametrize(
    "source, message",
    [
        ("a.txt:0", "weight of 'a.txt' must be a positive number"),
        ("a.txt:-1", "weight of 'a.txt' must be a positive number"),
        ("a.txt:nan", "weight of 'a.txt' must be a positive number"),
        ("a.txt,,b.txt", "NAME\\[:WEIGHT\\]"),
        ("a.txt:1,a.txt:2", "lists a text twice"),
    ],
)
def test_bad_calibration_mixtures(source, message):
    with pytest.raises(ValueError, match=message):
        CalibrationSpec(source)


def test_a_mixture_needs_a_window_per_text():
    with pytest.raises(ValueError, match=r"num_samples \(2\) must be at least the number of texts"):
        CalibrationSpec("a,b,c", num_samples=2)


def test_lora_spec_validation_and_round_trip():
    config = CompressConfig(heal="lora", lora=LoraSpec(steps=5, lr=1e-3, seq_len=64))
    assert CompressConfig.from_dict(config.to_dict()) == config
    old = {k: v for k, v in CompressConfig().to_dict().items() if k != "lora"}
    assert CompressConfig.from_dict(old) == CompressConfig()  # checkpoints from before the field
    # Checkpoints from before the relative rule trained at one fixed rate: read back as that rate.
    fixed = CompressConfig.from_dict({**old, "lora": {"steps": 16, "lr": 3e-5, "seq_len": 512}})
    assert fixed.lora == LoraSpec(16, 3e-5, 512) and fixed.lora.lr == 3e-5
    assert LoraSpec().lr is None and LoraSpec().relative_lr == 3e-4
    for kwargs, message in (
        ({"steps": 0}, "steps must be an integer >= 1"),
        ({"steps": True}, "steps must be an integer >= 1"),
        ({"lr": 0.0}, r"lr must be in \(0, 1\)"),
        ({"relative_lr": 1.0}, r"relative_lr must be in \(0, 1\)"),
        ({"relative_lr": None}, r"relative_lr must be in \(0, 1\)"),
        ({"seq_len": 1}, "seq_len must be >= 2"),
    ):
        with pytest.raises(ValueError, match=message):
            LoraSpec(**kwargs)
    with pytest.raises(
        ValueError, match=r"lora steps \(1\) must be at least the number of calibration texts"
    ):
        CompressConfig(heal="lora", lora=LoraSpec(steps=1), calibration=CalibrationSpec("a,b"))


@pytest.mark.parametrize(
    "recipe, method, sequential, allocation, heal",
    [
        ("whiten", "whiten", False, "uniform", "none"),
        ("svd", "svd", False, "uniform", "none"),
        ("whiten+allocate", "whiten", False, "budget", "none"),
        ("whiten+lora+closed-form+sequential", "whiten", True, "uniform", "closed-form+lora"),
        ("svd+lora", "svd", False, "uniform", "lora"),
    ],
)
def test_recipes_set_method_and_options(recipe, method, sequential, allocation, heal):
    base = CompressConfig(keep=0.6, align=16, sequential=True, heal="closed-form")
    config = base.with_recipe(recipe)
    assert (config.method, config.sequential, config.allocation, config.heal) == (
        method,
        sequential,
        allocation,
        heal,
    )
    assert (config.keep, config.align) == (0.6, 16)  # everything else comes from the base


@pytest.mark.parametrize(
    "recipe, message",
    [
        ("whiten+fast", "must be METHOD\\[\\+OPTION...\\] with distinct options"),
        ("whiten+lora+lora", "must be METHOD\\[\\+OPTION...\\] with distinct options"),
        ("pca", "unknown method 'pca'"),
        ("whiten+closed-form", "needs sequential calibration"),
        ("svd+sequential", "sequential needs method 'whiten'"),
    ],
)
def test_bad_recipes_name_the_problem(recipe, message):
    with pytest.raises(ValueError, match=message):
        CompressConfig().with_recipe(recipe)


@pytest.mark.parametrize(
    "recipe, needed",
    [("whiten", True), ("svd", False), ("whiten+sequential", False), ("whiten+sequential+allocate", True)],
)
def test_dense_grams_are_needed_for_one_shot_factors_or_allocation(recipe, needed):
    assert CompressConfig().with_recipe(recipe).needs_dense_grams is needed


@pytest.mark.parametrize(
    "inter, windows",
    [(1536, 32), (2048, 32), (2051, 32), (2052, 64), (4864, 128), (8192, 192), (8960, 224), (14336, 320)],
)
def test_calibration_windows_grow_with_the_mlps_width_in_multiples_of_the_efforts_count(inter, windows):
    # SmolLM2-135M and Gemma-3-270M keep 32; Qwen2.5-Coder-0.5B gets the 128 measured, 1.5B 224
    for effort in EFFORTS.values():
        assert effort.calibration_windows(inter, 512) == windows
    # the nearest multiple of 32 windows of 513 tokens to 12 tokens per width (at least 32)
    assert abs(windows * 513 - CALIB_TOKENS_PER_WIDTH * inter) <= 16 * 513 or windows == 32


def test_shorter_calibration_windows_are_more_of_them():
    assert EFFORTS["default"].calibration_windows(1536, 128) == 128  # 12 x 1536 tokens in windows of 129
