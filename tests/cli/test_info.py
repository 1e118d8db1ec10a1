"""``svdmlp info``: what a checkpoint holds, as text and as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

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


def test_json_through_a_link_and_never_over_a_directory(compressed, tmp_path, capsys):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    code, _, _ = run_cli(capsys, "info", compressed[2], "--json", link)
    assert code == 0 and link.is_symlink() and json.loads(real.read_text())["format"] == "svdmlp"
    assert_cli_error(
        capsys, "info", ["info", compressed[2], "--json", tmp_path], "is a directory; name a file"
    )


def test_info_reads_the_record_without_torch(compressed):
    """Issue 52, item 9: svdmlp info took 9 s of its 11 importing torch and transformers."""
    code = (
        "import sys; from svdmlp.cli import main; "
        f"assert main(['info', {str(compressed[2])!r}]) == 0; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
