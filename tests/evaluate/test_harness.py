"""lm-eval tasks on an in-memory model: deterministic scores on tiny local tasks, failures reported."""

from __future__ import annotations

import sys

import pytest

from conftest import tiny_model
from svdmlp.evaluate import harness, tasks

pytest.importorskip("lm_eval")

RECORDS = [
    {"question": "the quick fox", "choices": ["jumps over", "sleeps", "the dark hill number"], "label": 0},
    {"question": "the lazy dog", "choices": ["walks", "sings over the far hill"], "label": 1},
    {"question": "the brave king", "choices": ["speaks", "runs", "falls"], "label": 2},
    {"question": "the quiet queen", "choices": ["sings over", "waits"], "label": 0},
]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tasks")
    tasks.write_multiple_choice_task(folder, "tiny_mc", RECORDS)
    return folder


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def test_local_task_scores_are_deterministic(model, tokenizer, task_dir):
    first = harness.run_tasks(model, tokenizer, ["tiny_mc"], include_path=str(task_dir))
    second = harness.run_tasks(model, tokenizer, ["tiny_mc"], include_path=str(task_dir))
    assert first == second
    (result,) = first
    assert result.ok and result.samples == len(RECORDS)
    assert set(result.metrics) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}


def test_known_model_scores_pinned(model, tokenizer, task_dir):
    """The seeded tiny Llama's answers are fixed: a change here means lm-eval's scoring changed."""
    (result,) = harness.run_tasks(model, tokenizer, ["tiny_mc"], include_path=str(task_dir))
    assert result.metrics["acc"] == pytest.approx(0.5)
    assert result.metrics["acc_norm"] == pytest.approx(0.5)


def test_limit_scores_the_first_documents(model, tokenizer, task_dir):
    (result,) = harness.run_tasks(model, tokenizer, ["tiny_mc"], include_path=str(task_dir), limit=2)
    assert result.ok and result.samples == 2


@pytest.fixture
def no_registry(monkeypatch):
    """lm-eval's own task index takes 15 s to build: tests search the include path alone."""
    local = harness._task_manager.__wrapped__
    monkeypatch.setattr(harness, "_task_manager", lambda factory, path, defaults: local(factory, path, False))


def test_failures_are_reported_not_dropped(model, tokenizer, task_dir, tmp_path, no_registry):
    folder = tmp_path / "tasks"
    tasks.write_multiple_choice_task(folder, "tiny_mc", RECORDS)
    tasks.write_multiple_choice_task(folder, "gone_mc", RECORDS)
    (folder / "gone_mc.jsonl").unlink()
    names = ["nope_task", "gone_mc", "tiny_mc"]
    results = harness.run_tasks(model, tokenizer, names, include_path=str(folder))
    assert [r.name for r in results] == names
    assert results[0].error == f"unknown task 'nope_task': not in lm-eval's registry or {folder}"
    assert not results[1].ok and results[1].metrics == {} and "gone_mc.jsonl" in results[1].error
    assert results[2].ok and results[2].metrics["acc"] == pytest.approx(0.5)


def test_without_lm_eval_every_task_fails_with_the_install_hint(model, tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    results = harness.run_tasks(model, tokenizer, ["arc_easy", "piqa"])
    assert [r.error for r in results] == ["lm-eval is not installed: pip install 'svdmlp[eval]'"] * 2


def test_task_writer_rejects_bad_records(tmp_path):
    with pytest.raises(ValueError, match="label 3 is not a choice index"):
        tasks.write_multiple_choice_task(tmp_path, "bad", [{"question": "q", "choices": ["a"], "label": 3}])
    with pytest.raises(ValueError, match="task name must be"):
        tasks.write_multiple_choice_task(tmp_path, "bad-name", RECORDS)
