"""``svdmlp info``: what a checkpoint holds, as text and as JSON."""

from __future__ import annotations

import json

from conftest import assert_cli_error, run_cli
from svdmlp import checkpoint


def test_info(compressed, capsys):
    _, text, ckpt = compressed
    code, out, _ = run_cli(capsys, "info", ckpt)
    assert code == 0
    assert out.startswith(f"checkpoint {ckpt}: llama from ")
    assert "method whiten, keep 0.5, align 8, targets ['gate', 'up', 'down']" in out
    assert "16/16/16" in out and "achieved keep 0.4167" in out

    code, out, err = run_cli(capsys, "info", ckpt, "--json", "-")
    assert code == 0
    assert json.loads(out) == checkpoint.read_metadata(ckpt)  # standard output holds the JSON alone
    assert err.startswith(f"checkpoint {ckpt}: llama from ")  # the report moved to standard error


def test_info_of_something_that_is_not_a_checkpoint(compressed, tmp_path, capsys):
    model_dir, _, _ = compressed
    assert_cli_error(capsys, "info", ["info", model_dir], "is not an svdmlp checkpoint (no svdmlp.json)")
    assert_cli_error(capsys, "info", ["info", tmp_path / "nothing"], "does not exist")
