"""``svdmlp sweep --dataset`` (with ``--data-files``): the literature sets scored at every point, reported,
plotted and spelled out in the reproducing command line; the texts follow eval's rules."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from conftest import SAMPLE_TEXT, save_tiny_llama, tiny_sweep_argv
from svdmlp.cli import main

POINTS = ["dense", "whiten-keep0.5"]


@pytest.fixture
def sweep_argv(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_dir = save_tiny_llama(tmp_path / "tiny-llama", tokenizer)
    calib = tmp_path / "calib.txt"
    calib.write_text(SAMPLE_TEXT, encoding="utf-8")
    argv = tiny_sweep_argv(model_dir, calib, tmp_path / "out", "0.5", "whiten", score_text=False)
    return argv, tmp_path / "out"


def test_sweep_scores_a_dataset_from_its_local_copy(sweep_argv, wikitext, capsys):
    argv, out = sweep_argv
    options = ["--dataset", "wikitext2", "--data-files", f"wikitext2={wikitext}"]
    assert main(argv + options) == 0
    for point in POINTS:
        record = json.loads((out / "points" / f"{point}.json").read_text())
        # Only --dataset given: no default texts (shakespeare-heldout, gsm8k), as in eval.
        assert list(record["perplexity"]) == ["wikitext2"] and record["sweep"]["texts"] == ["wikitext2"]
        assert record["perplexity"]["wikitext2"] > 1
    dense = json.loads((out / "points" / "dense.json").read_text())["perplexity"]["wikitext2"]
    report = (out / "report.md").read_text()
    command = report.splitlines()[5]
    assert f"--dataset wikitext2 --data-files wikitext2={wikitext}" in command and "--text" not in command
    assert "| PPL wikitext2 |" in report and f"| {dense:,.4g} |" in report
    assert "![perplexity on wikitext2](ppl-wikitext2.png)" in report
    assert (out / "ppl-wikitext2.png").stat().st_size > 0

    # The command at the report's head is this sweep: rerun, it finds every point finished.
    capsys.readouterr()
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out.count("finished earlier, skipped") == len(POINTS)


def test_texts_and_datasets_together(sweep_argv, wikitext, tmp_path):
    argv, out = sweep_argv
    text = tmp_path / "own.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    options = ["--text", str(text), "--dataset", "wikitext2", "--data-files", f"wikitext2={wikitext}"]
    assert main(argv[:4] + ["--method", "svd"] + argv[6:] + options) == 0
    record = json.loads((out / "points" / "svd-keep0.5.json").read_text())
    assert list(record["perplexity"]) == [str(text), "wikitext2"]
    report = (out / "report.md").read_text()
    assert f"--text {text} --dataset wikitext2" in report.splitlines()[5]
    assert (out / "ppl-own.png").is_file() and (out / "ppl-wikitext2.png").is_file()


def test_dataset_option_errors_are_one_line(sweep_argv, wikitext, capsys):
    argv, out = sweep_argv
    for flags, message in (
        (["--data-files", f"wikitext2={wikitext}"], "--data-files given for ['wikitext2'], which are not"),
        (["--dataset", "wikitext2", "--data-files", "wikitext2"], "--data-files expects SET=PATH"),
        (["--dataset", "lambada"], "unknown perplexity set 'lambada'"),
        (["--dataset", "wikitext2", "--data-files", f"wikitext2={wikitext}.gone"], "does not exist"),
    ):
        assert main(argv + flags) == 2
        err = capsys.readouterr().err
        assert err.startswith("svdmlp sweep: error: ") and message in err and len(err.splitlines()) == 1
    assert not (out / "points").exists()  # every error comes before any work


def _resolved(*argv, inter=1536):
    from svdmlp.cli import build_parser
    from svdmlp.cli.sweep import with_effort

    return with_effort(build_parser().parse_args(["sweep", "--out", "x", *argv]), inter)


def test_with_no_method_a_sweep_runs_the_recipe_and_budgets_compress_uses():
    from svdmlp.config import EFFORTS

    default = _resolved()
    assert default.method == (EFFORTS["default"].recipe,) == ("fisher+allocate+sequential+closed-form+lora",)
    assert (default.calib_samples, default.heal_steps) == (32, 16)
    fast = _resolved("--effort", "fast")
    assert (fast.method, fast.calib_samples, fast.heal_steps) == (("fisher",), 32, 48)
    given = _resolved("--method", "whiten,svd", "--calib-samples", "8", "--heal-steps", "3")
    assert (given.method, given.calib_samples, given.heal_steps) == (("whiten", "svd"), 8, 3)
    assert _resolved(inter=4864).calib_samples == 128  # a wide MLP gets more windows, as in compress
