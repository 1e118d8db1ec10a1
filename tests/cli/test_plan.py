"""``svdmlp plan``: table, the same record through --json, errors as one line and exit 2."""

import json

import pytest

from svdmlp.cli import main


def run(capsys, *argv):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_and_json(capsys, tmp_path):
    argv = ["llama-3.2-1b", "--keep", "0.8", "--hardware", "h200", "--tokens", "1,512"]
    code, out, err = run(capsys, *argv, "--json", "-")
    assert code == 0
    assert "gate_up" in err and "predicted speedup" in err  # the tables on standard error
    payload = json.loads(out)  # standard output: the JSON alone
    assert payload["hardware"]["name"] == "H200"
    (model,) = payload["models"]
    assert model["ranks"]["gate"] == 1280
    assert [row["m"] for row in model["rows"]] == [1, 512]
    kernel = model["rows"][0]["kernels"][0]
    assert kernel["blocks"]["fits"] and kernel["best"] in kernel["schedules"]
    path = tmp_path / "plan.json"
    code, out, _ = run(capsys, *argv, "--json", str(path))
    assert code == 0 and "gate_up" in out and json.loads(path.read_text()) == payload


def test_launches_table_and_record(capsys):
    code, out, err = run(capsys, "llama-3.2-1b", "--tokens", "1,128", "--launches", "--json", "-")
    assert code == 0
    assert "Launch model, llama-3.2-1b" in err and "gated_expand+down" in err and "cublas" in err
    assert "rule broken" not in err
    (record,) = json.loads(out)["launches"]
    assert [row["m"] for row in record["rows"]] == [1, 128] and record["rule_problems"] == []
    decode = record["rows"][0]
    assert len(decode["launches"]) == 3 and decode["backend_path"] in ("fused", "unfused")


def test_the_launch_model_refuses_trainium(capsys):
    code, _, err = run(capsys, "--hardware", "trn1", "--launches")
    assert code == 2 and "models the Triton kernels on a GPU" in err


def test_trainium_and_default_model(capsys):
    code, out, _ = run(capsys, "--hardware", "trn1", "--tokens", "1")
    assert code == 0 and "smollm2-135m" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tokens", "0"], "token counts must be positive integers"),
        (["--tokens", ""], "token counts must be positive integers"),
        (["--keep", "1.5"], "keep must be in (0, 1]"),
        (["no-such-model"], "unknown model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("svdmlp plan: error: ") and message in err and err.count("\n") == 1


def test_a_token_list_that_is_not_numbers_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--tokens", "1,x"])
    assert exit_info.value.code == 2
    assert "argument --tokens: expected a comma-separated list, got '1,x'" in capsys.readouterr().err


def test_the_planner_imports_no_torch():
    """docs/architecture.md: `svdmlp plan` does not pay for torch (only --launches loads it)."""
    import subprocess
    import sys

    code = (
        "import sys, svdmlp.cli.plan, svdmlp.plan.render, svdmlp.plan.launches; print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
