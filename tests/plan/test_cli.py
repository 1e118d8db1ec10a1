"""``svdmlp plan`` through its argparse wiring: table, JSON last line, errors as ValueError."""

import argparse
import json

import pytest

from svdmlp.plan.cli import add_plan_parser


def run(argv):
    parser = argparse.ArgumentParser()
    add_plan_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    return args.func(args)


def test_table_and_json(capsys):
    assert run(["llama-3.2-1b", "--keep", "0.8", "--hardware", "h200", "--tokens", "1,512", "--json"]) == 0
    out = capsys.readouterr().out
    assert "gate_up" in out and "predicted speedup" in out
    payload = json.loads(out.strip().splitlines()[-1])
    assert payload["hardware"]["name"] == "H200"
    (model,) = payload["models"]
    assert model["ranks"]["gate"] == 1280
    assert [row["m"] for row in model["rows"]] == [1, 512]
    kernel = model["rows"][0]["kernels"][0]
    assert kernel["blocks"]["fits"] and kernel["best"] in kernel["schedules"]


def test_trainium_and_default_model(capsys):
    assert run(["--hardware", "trn1", "--tokens", "1"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tokens", "1,x"], "--tokens"),
        (["--tokens", "0"], "--tokens"),
        (["--keep", "1.5"], "keep"),
        (["no-such-model"], "unknown model"),
    ],
)
def test_bad_input_raises_value_error(argv, message):
    with pytest.raises(ValueError, match=message):
        run(argv)
