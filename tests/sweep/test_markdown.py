"""The sweep report's memory-quality points: one per record whose MLP bytes are known, labelled short."""

import pytest

from svdmlp.sweep import markdown


def _record(point, method, perplexity, mlp_params=None, **extra):
    record = {"point": point, "method": method, "perplexity": {"a": perplexity, "b": perplexity}, **extra}
    if mlp_params is not None:
        record["params"] = {"mlp": mlp_params}
    return record


def _records(second_method=None):
    records = [
        _record("dense", "dense", 10.0, 1000),
        _record("dense-int8", "dense", 10.0, 1000, quantize="int8", quantization={"mlp_bytes": 1100}),
        _record("whiten-keep0.8", "whiten", 20.0, 800, target_keep=0.8, factor_bits=16),
        _record(
            "whiten-keep0.8-factors-int4",
            "whiten",
            40.0,
            800,
            target_keep=0.8,
            factor_bits=4,
            quantization={"mlp_bytes": 500},
        ),
        _record("old", "whiten", 30.0, target_keep=0.9),  # recorded before sweeps counted bytes
    ]
    if second_method:
        records.append(_record(f"{second_method}-keep0.8", second_method, 20.0, 800, target_keep=0.8))
    return records


def test_memory_points_name_the_keep_and_factor_width_and_skip_unknown_sizes():
    points = markdown._memory_points(_records())
    assert [label for label, _, _ in points] == [
        "dense",
        "dense int8 RTN",
        "keep 0.8",
        "keep 0.8, factors int4",
    ]
    assert [megabytes for _, megabytes, _ in points] == pytest.approx([0.002, 0.0011, 0.0016, 0.0005])
    assert [geomean for _, _, geomean in points] == pytest.approx([1.0, 1.0, 2.0, 4.0])


def test_a_corrected_baseline_is_named_by_its_scheme_method_and_correction():
    record = _record("dense-q", "dense", 10.0, quantize="int3-asym-gptq+0.05")
    assert markdown.series(record) == "dense int3-asym GPTQ + correction 0.05"
    assert markdown.series({**record, "quantize": "int4-gptq"}) == "dense int4 GPTQ"


def test_the_pareto_front_keeps_what_no_point_beats_on_both_axes():
    points = [("a", 40.0, 1.10), ("b", 50.0, 1.05), ("c", 45.0, 1.20), ("d", 40.0, 1.15), ("e", 160.0, 1.0)]
    # c is beaten by a (smaller and better), d by a (as small, better); ties on both axes keep both
    assert [label for label, _, _ in markdown.pareto_front(points)] == ["a", "b", "e"]
    assert [label for label, _, _ in markdown.pareto_front([*points, ("a2", 40.0, 1.10)])] == [
        "a",
        "a2",
        "b",
        "e",
    ]


def test_memory_points_name_the_recipe_where_several_ran():
    labels = [label for label, _, _ in markdown._memory_points(_records("svd"))]
    assert labels[2:] == ["whiten keep 0.8", "whiten keep 0.8, factors int4", "svd keep 0.8"]


def test_table_gives_the_in_domain_and_unseen_means_apart():
    texts = ["python-heldout", "gsm8k-heldout", "report-css"]
    dense = {"point": "dense", "target_keep": 1.0, "achieved_keep": 1.0, "compress_seconds": 0.0}
    dense["perplexity"] = {"python-heldout": 2.0, "gsm8k-heldout": 4.0, "report-css": 3.0}
    point = {**dense, "point": "keep0.8", "target_keep": 0.8, "achieved_keep": 0.8}
    point["perplexity"] = {"python-heldout": 2.5, "gsm8k-heldout": 4.4, "report-css": 6.0}
    table = markdown._table([{**dense, "method": "dense"}, {**point, "method": "fisher"}], texts, [])
    header, _, _, row = table.splitlines()
    assert header.split("|")[-4:-1] == [
        " geomean ×dense, in-domain ",
        " geomean ×dense, unseen ",
        " geomean ×dense ",
    ]
    in_domain, unseen, everything = (cell.strip() for cell in row.split("|")[-4:-1])
    assert in_domain == f"×{(1.25 * 1.1) ** 0.5:.3g}" and unseen == "×2"
    assert everything == f"×{(1.25 * 1.1 * 2.0) ** (1 / 3):.3g}"
