"""A sweep's dense baselines by name: any scheme, rounded to nearest or by GPTQ, with a correction."""

import pytest

from svdmlp.quantize import Quantization
from svdmlp.sweep.points import Point, plan


def test_a_baseline_names_its_scheme_its_rounding_and_its_correction():
    assert Quantization.parse("int8") == Quantization("int8")
    assert Quantization.parse("int4-gptq") == Quantization("int4", gptq=True)
    assert Quantization.parse("int3-asym-gptq+0.05") == Quantization("int3-asym", True, 0.05)
    assert Quantization.parse("int2g64-asym") == Quantization("int2g64-asym")
    int8_factors = Quantization.parse("int4-asym-gptq+0.05-int8")
    assert int8_factors == Quantization("int4-asym", True, 0.05, correction_bits=8)
    assert int8_factors.label == "int4-asym GPTQ + correction 0.05 (int8)"
    assert Quantization.parse("int3-gptq+5e-2").correction_keep == 0.05
    points = plan((0.8,), ("whiten",), ("int4-gptq", "int3-asym-gptq+0.1"))
    assert [p.name for p in points[:3]] == ["dense", "dense-int4-gptq", "dense-int3-asym-gptq+0.1"]
    assert points[2] == Point("dense", quantize="int3-asym-gptq+0.1")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("int9", "unknown quantization 'int9'"),
        ("int4-rtn", "unknown quantization 'int4-rtn'"),
        ("int3+0.1", "a correction is fitted on calibration: int3-gptq\\+0.1"),
        ("int3-gptq+abc", "correction is KEEP, a number"),
        ("int3-gptq+0", "correction is KEEP, a number"),
        ("int3-gptq+0.1-int3", "or KEEP-int8 or KEEP-int4"),
    ],
)
def test_a_bad_baseline_is_refused_before_any_work(spec, message):
    with pytest.raises(ValueError, match=message):
        plan((0.8,), ("whiten",), (spec,))
