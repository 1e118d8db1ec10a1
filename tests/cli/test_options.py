"""The shared options: comma-separated lists, the texts eval and sweep score, the ``--json`` writer."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from svdmlp.cli import build_parser, options


def test_comma_list_parses_and_drops_blanks():
    assert options.comma_list(int)("1, 16,,128") == (1, 16, 128)
    assert options.comma_list(float)("0.8,0.6") == (0.8, 0.6)
    assert options.comma_list()(" gate , up ") == ("gate", "up")
    assert options.comma_list(int)("") == ()
    with pytest.raises(argparse.ArgumentTypeError, match="expected a comma-separated list, got '1,x'"):
        options.comma_list(int)("1,x")


def test_a_comma_list_flag_given_twice_adds_to_the_list():
    # `sweep --keep 0.95 --keep 0.9` once ran only keep 0.9: argparse's store keeps the last value.
    keeps = build_parser().parse_args(["sweep", "--out", "o", "--keep", "0.95", "--keep", "0.9,0.8"]).keep
    assert keeps == (0.95, 0.9, 0.8)
    again = ["bench", "e2e", "--batch", "1", "--batch", "1,16"]  # the device scripts' dry runs do this
    assert build_parser().parse_args(again).batch == (1, 16)
    assert build_parser().parse_args(["sweep", "--out", "o"]).keep == (0.95, 0.9, 0.8, 0.7, 0.6)
    layers = ["compress", "--out", "o", "--layers", "0", "--layers", "2"]
    assert build_parser().parse_args(layers).layers == (0, 2)


def _args(**flags) -> argparse.Namespace:
    values = {"text": None, "dataset": [], "data_files": [], **flags}
    return argparse.Namespace(**values)


def _texts(args, default=()):
    return options.eval_texts(args, options.eval_sources(args, default), tokenizer=None)


def test_eval_texts_rules(tmp_path, wikitext):
    text = tmp_path / "t.txt"
    text.write_text("some words", encoding="utf-8")
    assert _texts(_args(), (str(text),)) == [(str(text), "some words")]
    assert _texts(_args(text=[str(text)]), ("unused",)) == [(str(text), "some words")]
    named = _texts(_args(dataset=["wikitext2"], data_files=[f"wikitext2={wikitext}"]), ("x",))
    assert [name for name, _ in named] == ["wikitext2"]  # a --dataset replaces the default texts
    assert named[0][1].startswith(" the quick fox jumps over the green hill number 0. \n\n")
    with pytest.raises(ValueError, match=r"\['wikitext2'\] named more than once"):
        options.eval_sources(_args(dataset=["wikitext2", "wikitext2"], data_files=[f"wikitext2={wikitext}"]))


def test_eval_sources_are_checked_before_anything_is_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="gone.txt does not exist"):
        options.eval_sources(_args(text=[str(tmp_path / "gone.txt")]))
    with pytest.raises(ValueError, match="unknown perplexity set 'lambada'"):
        options.eval_sources(_args(dataset=["lambada"]))
    assert options.eval_sources(_args(), ("chat-heldout", "python-heldout")) == [
        "chat-heldout",
        "python-heldout",
    ]


def test_write_json_to_a_file_replaces_it_whole(tmp_path):
    path = tmp_path / "deep" / "result.json"
    options.write_json({"b": 1, "a": [1.5]}, str(path))
    assert json.loads(path.read_text()) == {"a": [1.5], "b": 1}
    options.write_json({"c": None}, str(path))
    assert json.loads(path.read_text()) == {"c": None}
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]  # no staging file left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would create it, not mkstemp's 0600


def test_write_json_to_standard_output(capsys):
    options.write_json({"x": 1}, "-")
    assert json.loads(capsys.readouterr().out) == {"x": 1}


def test_a_record_that_is_not_json_leaves_the_old_file(tmp_path):
    path = tmp_path / "result.json"
    options.write_json({"ok": True}, str(path))
    with pytest.raises(TypeError):
        options.write_json({"bad": object()}, str(path))
    assert json.loads(path.read_text()) == {"ok": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_the_model_help_names_every_built_in_model_default_first():
    from svdmlp import models

    assert set(options.BUILT_IN_MODELS) == set(models.PACKAGED)
    assert options.BUILT_IN_MODELS[0] == models.DEFAULT_MODEL


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (options.positive_float, "nan", "expected a finite number, got 'nan'"),
        (options.positive_float, "inf", "expected a finite number, got 'inf'"),
        (options.positive_float, "-1", "expected a number > 0, got -1"),
        (options.positive_float, "0", "expected a number > 0, got 0"),
        (options.positive_int, "0", "expected an integer >= 1, got 0"),
        (options.positive_int, "1.5", "expected an integer, got '1.5'"),
        (options.nonnegative_float, "-0.5", "expected a number >= 0, got -0.5"),
        (options.probability, "0", "expected a number in (0, 1], got 0"),
        (options.keep_fraction, "1e-9", "keep 1e-09 is below 0.01"),
        (options.keep_fraction, "1.5", "keep must be in (0, 1]"),
    ],
)
def test_numbers_are_refused_as_they_are_parsed(kind, text, message):
    """Issue 52, items 8 and 9: --max-memory nan, --temperature inf and keep 1e-9 were taken."""
    with pytest.raises(argparse.ArgumentTypeError) as error:
        kind(text)
    assert str(error.value).startswith(message)


def test_numbers_in_range_pass():
    assert options.positive_float("1e-9") == 1e-9 and options.positive_int("7") == 7
    assert options.nonnegative_float("0") == 0 and options.probability("1") == 1
    assert options.keep_fraction("0.01") == 0.01
