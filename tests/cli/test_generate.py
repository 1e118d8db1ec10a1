"""``svdmlp generate``: the fast engine (default) and ``--engine hf`` print the same greedy text,
sampling follows its seed, and bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_cli_error, run_cli


def test_fast_engine_prints_what_hf_generate_prints(model_dir, capsys):
    args = ["generate", model_dir, "--prompt", "the quick fox", "--max-new-tokens", "12"]
    code, fast, _ = run_cli(capsys, *args)
    assert code == 0
    code, hf, _ = run_cli(capsys, *args, "--engine", "hf")
    assert code == 0 and fast == hf and fast.endswith("\n") and len(fast) > 1
    code, out, err = run_cli(capsys, *args, "--json", "-")
    record = json.loads(out)
    said, streamed = err.split("\n", 1)
    assert said == "svdmlp: sampling greedy (the model's generation config; --temperature 0 for greedy)"
    assert code == 0 and streamed == fast  # the streamed text moves to standard error
    assert len(record["new_ids"]) == 12 and record["text"] == fast.removesuffix("\n")


def test_the_compiled_engine_prints_the_same_text(model_dir, capsys):
    args = ["generate", model_dir, "--prompt", "the quick fox", "--max-new-tokens", "6"]
    code, plain, _ = run_cli(capsys, *args)
    assert code == 0
    code, compiled, _ = run_cli(capsys, *args, "--compile")
    assert code == 0 and compiled == plain


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_sampling_follows_its_seed(model_dir, capsys, engine):
    """A seed repeats its text, other seeds change it, and none of them is the greedy text: the
    sampling settings reach the generation (greedy decoding would also repeat itself)."""
    args = ["generate", model_dir, "--prompt", "the", "--max-new-tokens", "12", "--engine", engine]
    sampled = [*args, "--temperature", "1.0", "--top-k", "50", "--top-p", "0.95"]

    def new_ids(*extra) -> list[int]:
        code, out, _ = run_cli(capsys, *extra, "--json", "-")
        assert code == 0
        return json.loads(out)["new_ids"]

    greedy = new_ids(*args)
    first = new_ids(*sampled, "--seed", "5")
    assert new_ids(*sampled, "--seed", "5") == first
    others = [new_ids(*sampled, "--seed", str(seed)) for seed in (6, 7, 8)]
    assert all(ids != first for ids in others)
    assert greedy not in [first, *others]


def test_a_model_that_says_sample_samples_unless_told_otherwise(model_dir, capsys):
    """As ``model.generate`` does: the model's generation config decides, each flag overrides its part."""
    path = Path(model_dir) / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    args = ["generate", model_dir, "--prompt", "the", "--max-new-tokens", "12", "--json", "-"]
    greedy = json.loads(run_cli(capsys, *args)[1])["new_ids"]
    path.write_text(json.dumps({**config, "do_sample": True, "top_k": 40, "top_p": 0.9}))
    code, out, err = run_cli(capsys, *args)
    record = json.loads(out)
    assert code == 0 and record["sampling"] == {"temperature": 1.0, "top_k": 40, "top_p": 0.9, "seed": 0}
    assert err.startswith("svdmlp: sampling temperature 1, top-k 40, top-p 0.9, seed 0 (the model's")
    assert record["new_ids"] != greedy
    code, out, err = run_cli(capsys, *args, "--temperature", "0")
    assert json.loads(out)["new_ids"] == greedy and err.startswith("svdmlp: sampling greedy (as given")


def test_top_k_one_prints_the_greedy_text(model_dir, capsys):
    args = ["generate", model_dir, "--prompt", "the old king", "--max-new-tokens", "10"]
    greedy = run_cli(capsys, *args)[1]
    assert run_cli(capsys, *args, "--temperature", "3", "--top-k", "1")[1] == greedy


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--top-p", "1.5"], "argument --top-p: expected a number in (0, 1], got 1.5"),
        (["--top-p", "nan"], "argument --top-p: expected a finite number, got 'nan'"),
        (["--top-k", "0"], "argument --top-k: expected an integer >= 1, got 0"),
        (["--temperature", "-1"], "argument --temperature: expected a number >= 0, got -1"),
        (["--temperature", "inf"], "argument --temperature: expected a finite number, got 'inf'"),
        (["--max-new-tokens", "0"], "argument --max-new-tokens: expected an integer >= 1, got 0"),
    ],
)
def test_bad_numbers_are_usage_errors_before_the_model_loads(capsys, flags, message):
    """Issue 52, item 9: once checked only after the model had loaded (--temperature inf was taken)."""
    with pytest.raises(SystemExit) as exit_info:
        run_cli(capsys, "generate", "/nonexistent/model", "--prompt", "x", *flags)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_prompt_too_long_for_the_model_exits_2(model_dir, capsys, engine):
    """Issue 52, item 8: --engine hf once generated past the model's 256 positions, with exit 0."""
    argv = ["generate", model_dir, "--prompt", "x", "--max-new-tokens", "300", "--engine", engine]
    assert_cli_error(
        capsys, "generate", argv, "prompt of 1 tokens + 300 new tokens exceeds the model's context of 256"
    )
    argv[argv.index("300")] = "1000000000"
    assert_cli_error(capsys, "generate", argv, "+ 1000000000 new tokens exceeds")


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_an_empty_prompt_exits_2(model_dir, capsys, engine):
    """Issue 52, item 6: --engine hf crashed on it (an internal error, exit 1)."""
    argv = ["generate", model_dir, "--prompt", "", "--engine", engine]
    assert_cli_error(capsys, "generate", argv, "the prompt is empty")


def test_compile_with_the_hf_engine_exits_2(model_dir, capsys):
    argv = ["generate", model_dir, "--prompt", "x", "--engine", "hf", "--compile"]
    assert_cli_error(capsys, "generate", argv, "--engine hf has none")


def test_generate_is_greedy_and_repeatable(compressed, capsys):
    _, _, ckpt = compressed
    code, first, _ = run_cli(capsys, "generate", ckpt, "--prompt", "the quick", "--max-new-tokens", "5")
    assert code == 0
    code, second, _ = run_cli(capsys, "generate", ckpt, "--prompt", "the quick", "--max-new-tokens", "5")
    assert code == 0 and first == second and first.endswith("\n")


def test_generate_input_errors(compressed, capsys):
    _, _, ckpt = compressed
    assert_cli_error(
        capsys, "generate", ["generate", ckpt, "--prompt", "x", "--chat"], "tokenizer has no chat template"
    )


def test_triton_backend_on_cpu_without_interpreter(compressed, monkeypatch, capsys):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _, _, ckpt = compressed
    assert_cli_error(
        capsys,
        "generate",
        ["generate", ckpt, "--prompt", "x", "--backend", "triton"],
        "backend 'triton' is unavailable: Triton kernels need a CUDA device",
    )


def test_cuda_device_without_a_gpu(compressed, monkeypatch, capsys):
    _, _, ckpt = compressed
    assert_cli_error(
        capsys,
        "generate",
        ["generate", ckpt, "--prompt", "x", "--device", "cuda"],
        "--device cuda was asked for but no CUDA GPU is available",
    )


def test_a_gemma_prompt_starts_with_its_bos_token(tmp_path, tokenizer, capsys):
    from conftest import untied_model

    directory = tmp_path / "tiny-gemma"
    untied_model("gemma2").save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    code, out, _ = run_cli(
        capsys, "generate", directory, "--prompt", "the quick fox", "--max-new-tokens", "3", "--json", "-"
    )
    assert code == 0
    assert json.loads(out)["prompt_ids"] == [tokenizer.bos_token_id, *tokenizer("the quick fox")["input_ids"]]
