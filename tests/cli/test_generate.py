"""``svdmlp generate``: the fast engine (default) and ``--engine hf`` print the same greedy text."""

from __future__ import annotations

import pytest

from svdmlp.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_fast_engine_prints_what_hf_generate_prints(model_dir, capsys):
    args = ["generate", model_dir, "--prompt", "the quick fox", "--max-new-tokens", "12"]
    code, fast, _ = run(capsys, *args)
    assert code == 0
    code, hf, _ = run(capsys, *args, "--engine", "hf")
    assert code == 0 and fast == hf and fast.endswith("\n") and len(fast) > 1


def test_sampling_flags_are_seeded(model_dir, capsys):
    args = ["generate", model_dir, "--prompt", "the", "--max-new-tokens", "12", "--temperature", "1.0"]
    outputs = {run(capsys, *args, "--top-k", "20", "--top-p", "0.9", "--seed", "5")[1] for _ in range(2)}
    assert len(outputs) == 1


def test_top_k_one_prints_the_greedy_text(model_dir, capsys):
    args = ["generate", model_dir, "--prompt", "the old king", "--max-new-tokens", "10"]
    greedy = run(capsys, *args)[1]
    assert run(capsys, *args, "--temperature", "3", "--top-k", "1")[1] == greedy


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"), (["--top-k", "0"], "top_k must be >= 1")],
)
def test_bad_sampling_flags_exit_2(model_dir, capsys, flags, message):
    code, _, err = run(capsys, "generate", model_dir, "--prompt", "x", *flags)
    assert code == 2 and message in err and "Traceback" not in err


def test_prompt_too_long_for_the_model_exits_2(model_dir, capsys):
    code, _, err = run(capsys, "generate", model_dir, "--prompt", "x", "--max-new-tokens", "300")
    assert code == 2 and "exceeds the cache limit of 256" in err
