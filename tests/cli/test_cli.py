"""The ``svdmlp`` command as a whole: every subcommand has help, usage errors exit 2, ``--json`` writes
the same record to a file or to standard output, ``python -m svdmlp`` works and ``--help`` imports no
torch, and a model that cannot be found is one line for every command."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from conftest import assert_cli_error, run_cli
from svdmlp.cli import build_parser, main


def test_every_subcommand_has_help(capsys):
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names = sorted(commands.choices)
    assert {"compress", "eval", "generate", "info", "plan", "bench"} <= set(names)
    argvs = [[name] for name in names]
    for name, sub in commands.choices.items():  # nested commands, e.g. bench kernel
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                argvs += [[name, nested] for nested in action.choices]
    for argv in argvs:
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: svdmlp {' '.join(argv)}"), argv


def test_argparse_errors_exit_2(capsys):
    for argv in (["compress", "--keep", "half", "--out", "x"], ["compress", "m"], ["nope"], []):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert "usage: svdmlp" in capsys.readouterr().err


def test_hub_id_while_offline(compressed, offline, tmp_path, capsys):
    _, text, _ = compressed
    for command, argv in (
        ("generate", ["generate", "someone/no-such-model", "--prompt", "x"]),
        ("eval", ["eval", "someone/no-such-model", "--text", text]),
        ("compress", ["compress", "someone/no-such-model", "--calib", text, "--out", tmp_path / "out"]),
    ):
        assert_cli_error(
            capsys,
            command,
            argv,
            "could not load model 'someone/no-such-model': it is not a local directory and the Hugging Face hub could not provide it",
        )


def test_python_dash_m_svdmlp_is_the_command_and_help_imports_no_torch():
    """``python -m svdmlp`` where the console script is not on PATH; ``--help`` answers without
    importing torch or transformers (seconds of imports)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "svdmlp", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: svdmlp ")
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "svdmlp.cli" in imported
    heavy = sorted(name for name in imported if name.split(".")[0] in ("torch", "transformers", "numpy"))
    assert heavy == []


def test_json_to_a_file_or_to_standard_output_is_the_same_record(tmp_path, capsys):
    argv = ["plan", "smollm2-135m", "--tokens", "1"]
    path = tmp_path / "plan.json"
    assert main([*argv, "--json", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "smollm2-135m" in out and out.endswith(f"wrote {path}\n") and err == ""
    assert main([*argv, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads(path.read_text())  # standard output: the JSON alone
    assert "smollm2-135m" in err  # the report, moved to standard error


def test_every_command_with_a_result_takes_json(capsys):
    for argv in (
        ["compress"],
        ["eval"],
        ["generate"],
        ["info"],
        ["plan"],
        ["sweep"],
        ["bench", "kernel"],
        ["bench", "e2e"],
    ):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        assert "--json FILE" in capsys.readouterr().out, argv


def test_an_os_error_is_one_line_and_exit_2(compressed, tmp_path, capsys, monkeypatch):
    from svdmlp import checkpoint_record

    def unwritable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "out"))

    monkeypatch.setattr(checkpoint_record, "read_metadata", unwritable)
    assert_cli_error(capsys, "info", ["info", compressed[2]], "Permission denied")


def test_a_bug_is_one_line_with_the_way_to_its_traceback(compressed, capsys, monkeypatch):
    from svdmlp import checkpoint_record

    def broken(*args, **kwargs):
        raise TypeError("an argument of the wrong type")

    monkeypatch.setattr(checkpoint_record, "read_metadata", broken)
    monkeypatch.delenv("SVDMLP_TRACEBACK", raising=False)
    code, _, err = run_cli(capsys, "info", compressed[2])
    assert code == 1 and "Traceback" not in err
    assert err.strip() == (
        "svdmlp info: internal error: TypeError: an argument of the wrong type (a bug in svdmlp: run again "
        "with SVDMLP_TRACEBACK=1 for the traceback, and report it)"
    )
    monkeypatch.setenv("SVDMLP_TRACEBACK", "1")
    with pytest.raises(TypeError):
        run_cli(capsys, "info", compressed[2])
