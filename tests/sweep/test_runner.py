"""``svdmlp sweep`` on a tiny model: every point saved, Grams collected once, a rerun skips all."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from conftest import (
    SAMPLE_TEXT,
    backward_stopped_at,
    count_calls,
    forward_stopped_at,
    run_cli,
    save_tiny_llama,
    tiny_sweep_argv,
)
from svdmlp.cli import main
from svdmlp.compression import factorise, output_grams, pipeline
from svdmlp.compression.steps import calibration as calibration_step
from svdmlp.compression.steps import quantization
from svdmlp.evaluate import harness, tasks

RECORDS = [
    {"question": "the quick fox", "choices": ["jumps over", "sleeps"], "label": 0},
    {"question": "the lazy dog", "choices": ["walks", "sings over the far hill"], "label": 1},
]
POINTS = ["dense", "whiten-keep0.8", "whiten-keep0.5", "svd-keep0.8", "svd-keep0.5"]


@pytest.fixture
def setup(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_dir = save_tiny_llama(tmp_path / "tiny-llama", tokenizer)
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    return tiny_sweep_argv(model_dir, text, tmp_path / "out", "0.8,0.5", "whiten,svd"), tmp_path / "out"


def test_a_dry_run_predicts_the_compressions_and_writes_nothing(setup, capsys):
    argv, out = setup
    assert main([*argv, "--dry-run"]) == 0
    printed = capsys.readouterr()
    assert printed.err.startswith("svdmlp: predicted: peak memory ")
    assert "peak memory  time" in printed.out and "GFLOP/s" in printed.out
    assert not out.exists()


def test_sweep_writes_points_report_and_plots_then_resumes(setup, monkeypatch, capsys):
    argv, out = setup
    calibrations = count_calls(monkeypatch, calibration_step, "collect_shared")
    assert main(argv) == 0
    assert capsys.readouterr().err.startswith("svdmlp: predicted: peak memory ")  # before any work
    # The model is on disk: each keep makes its input Grams one layer at a time, nothing is shared.
    assert len(calibrations) == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no scratch left
    assert sorted(p.stem for p in (out / "points").iterdir()) == sorted(POINTS)
    records = {p: json.loads((out / "points" / f"{p}.json").read_text()) for p in POINTS}
    assert records["dense"]["achieved_keep"] == 1.0
    assert records["whiten-keep0.5"]["achieved_keep"] < records["whiten-keep0.8"]["achieved_keep"] < 1
    assert records["whiten-keep0.8"]["calibration"] == records["whiten-keep0.5"]["calibration"]
    assert records["svd-keep0.8"]["calibration"] == {}
    report = (out / "report.md").read_text()
    assert (
        report.splitlines()[5].startswith("svdmlp sweep ") and "--keep 0.8,0.5 --method whiten,svd" in report
    )
    assert all(f"| {p} |" in report for p in POINTS)
    assert (out / "ppl-text.png").stat().st_size > 0
    first_report = report

    compresses = count_calls(monkeypatch, pipeline, "compress")
    assert main(argv) == 0
    assert compresses == [] and len(calibrations) == 0
    rerun = capsys.readouterr()
    assert rerun.out.count("finished earlier, skipped") == len(POINTS)
    assert "predicted" not in rerun.err  # nothing left to run, nothing to predict
    assert (out / "report.md").read_text() == first_report

    # No point here heals by distillation, so other healing knobs (a new default, say) change none of
    # them; and the dense point depends on no compression setting at all.
    assert main(argv + ["--heal-lr", "0.5"]) == 0
    assert compresses == []
    other = argv[:2] + ["--keep", "0.3", "--method", "svd"] + argv[6:] + ["--calib-samples", "2"]
    assert main(other) == 0
    assert len(compresses) == 1  # svd-keep0.3 only: the dense point is reused under other calibration


def test_a_second_sweep_into_one_output_refuses_at_once(setup, capsys):
    from svdmlp.compression import workspace

    argv, out = setup
    with workspace.exclusive(out):  # a first sweep at work
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"another svdmlp run (process {os.getpid()}) is writing {out}" in err and "Traceback" not in err
    assert not (out / "points").exists()


def test_resume_refuses_other_settings(setup, capsys):
    argv, out = setup
    assert main(argv[:4] + argv[6:] + ["--method", "svd"]) == 0  # dense and svd points only
    capsys.readouterr()
    changed = [a if a != "2" else "1" for a in argv]  # --max-windows 1
    assert main(changed) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("svdmlp: predicted: ") and len(err) == 2
    assert err[1].startswith(
        f"svdmlp sweep: error: {out / 'points' / 'dense.json'} was made with other settings"
    )


def test_sweep_with_a_task_plots_accuracy_and_reports_failures(setup, tmp_path, monkeypatch, capsys):
    argv, out = setup
    local = harness._task_manager.__wrapped__  # lm-eval's own 15 s index is not needed here
    monkeypatch.setattr(harness, "_task_manager", lambda factory, path, defaults: local(factory, path, False))
    pytest.importorskip("lm_eval")
    tasks.write_multiple_choice_task(tmp_path / "tasks", "tiny_mc", RECORDS)
    argv = argv[:2] + argv[6:] + ["--method", "whiten", "--keep", "0.5"]
    argv += ["--tasks", "tiny_mc,nope_mc", "--include-path", str(tmp_path / "tasks")]
    assert main(argv) == 1
    assert "task nope_mc failed on dense: unknown task 'nope_mc'" in capsys.readouterr().out
    report = (out / "report.md").read_text()
    assert (out / "acc-tiny-mc.png").is_file() and "## Failed tasks" in report
    record = json.loads((out / "points" / "whiten-keep0.5.json").read_text())
    assert set(record["tasks"]["tiny_mc"]["metrics"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}


def test_recipes_compare_methods_at_equal_parameters(tmp_path, tokenizer, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_dir = save_tiny_llama(tmp_path / "tiny-llama", tokenizer)
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    out = tmp_path / "out"
    recipes = "whiten+sequential+closed-form,whiten+lora,whiten+sequential"
    argv = tiny_sweep_argv(model_dir, text, out, "0.5", recipes) + ["--heal-steps", "2"]
    calibrations = count_calls(monkeypatch, calibration_step, "collect_shared")
    assert main(argv) == 0
    assert len(calibrations) == 0  # the model is on disk: no input Grams are shared
    records = {p.stem: json.loads(p.read_text()) for p in (out / "points").iterdir()}
    names = [f"{r}-keep0.5" for r in recipes.split(",")]
    assert sorted(records) == sorted(["dense", *names])
    assert len({records[n]["params"]["mlp"] for n in names}) == 1  # equal parameters
    assert records["whiten+lora-keep0.5"]["timings"]["healing"] > 0
    healing = records["whiten+lora-keep0.5"]["healing"]  # what distillation did, kept with the point
    assert healing["steps"] == 2 and len(healing["losses"]) == 2 and "reverted" in healing
    assert records["whiten+sequential-keep0.5"]["healing"] == {}
    assert records["whiten+sequential-keep0.5"]["calibration"]["sequential"] is True
    report = (out / "report.md").read_text()
    assert (
        f"--method {recipes}" in report
        and "--heal-steps 2 --heal-relative-lr 0.0003 --heal-seq-len 512" in report
    )
    assert main(argv[:-1] + ["3"]) == 2  # other healing steps: the whiten+lora point is another one
    assert "was made with other compress" in capsys.readouterr().err

    # A point from before the relative rate healed at one fixed rate: the same rate resumes it, the
    # relative default does not.
    path = out / "points" / "whiten+lora-keep0.5.json"
    record = json.loads(path.read_text())
    record["sweep"]["compress"]["lora"] = {"steps": 2, "lr": 3e-5, "seq_len": 512}
    path.write_text(json.dumps(record))
    compresses = count_calls(monkeypatch, pipeline, "compress")
    assert main(argv + ["--heal-lr", "3e-5"]) == 0 and compresses == []
    assert main(argv) == 2
    assert "was made with other compress" in capsys.readouterr().err


def test_bad_recipe_is_refused_before_any_work(setup, capsys):
    argv, out = setup
    argv[argv.index("--method") + 1] = "whiten+closed-form"
    assert main(argv) == 2
    assert "heal 'closed-form' needs sequential calibration" in capsys.readouterr().err
    assert not out.exists()


def test_a_sweep_shares_the_output_gradient_grams_through_disk(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_dir = save_tiny_llama(tmp_path / "tiny-llama", tokenizer)
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    out = tmp_path / "out"
    calibrations = count_calls(monkeypatch, calibration_step, "collect_shared")
    assert main(tiny_sweep_argv(model_dir, text, out, "0.8,0.5", "fisher")) == 0
    assert len(calibrations) == 1  # made once, read from disk by both keeps
    records = {p.stem: json.loads(p.read_text()) for p in (out / "points").iterdir()}
    assert records["fisher-keep0.8"]["calibration"] == records["fisher-keep0.5"]["calibration"]
    assert records["fisher-keep0.5"]["achieved_keep"] < records["fisher-keep0.8"]["achieved_keep"]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the shared Grams deleted


def test_quantized_baselines_and_factors_are_points_at_their_bytes(tmp_path, tokenizer, monkeypatch, capsys):
    from svdmlp.sweep.points import mlp_bytes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_dir = save_tiny_llama(tmp_path / "tiny-llama", tokenizer)
    text, other = tmp_path / "text.txt", tmp_path / "other.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    other.write_text(SAMPLE_TEXT[::-1], encoding="utf-8")
    out = tmp_path / "out"
    argv = tiny_sweep_argv(model_dir, text, out, "0.5", "whiten") + ["--text", str(other)]
    argv += ["--quantize", "int8,int4-gptq,int3g16-asym-gptq+0.5", "--factor-bits", "16,8,4"]
    compresses = count_calls(monkeypatch, pipeline, "compress")
    quantizations = count_calls(monkeypatch, quantization, "quantize_checkpoint")
    assert main(argv) == 0
    assert "(quantizing not counted)" in capsys.readouterr().err
    assert len(compresses) == 1 and len(quantizations) == 2  # one compression serves every width
    names = ["dense", "dense-int8", "dense-int4-gptq", "dense-int3g16-asym-gptq+0.5"]
    names += ["whiten-keep0.5", "whiten-keep0.5-factors-int8", "whiten-keep0.5-factors-int4"]
    records = {p.stem: json.loads(p.read_text()) for p in (out / "points").iterdir()}
    assert sorted(records) == sorted(names)
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the kept model deleted
    sizes = [mlp_bytes(records[name]) for name in names]
    assert sizes[1] < sizes[0] / 1.9 and sizes[2] < sizes[1] / 1.8  # int8 and int4 with their scales
    assert sizes[5] < 0.6 * sizes[4] and sizes[6] < 0.7 * sizes[5]  # tiny factors: scales weigh more
    corrected = records["dense-int3g16-asym-gptq+0.5"]["quantization"]
    assert corrected["correction_keep"] == 0.5 and corrected["zero_point"] and corrected["bits"] == 3
    assert sizes[3] == corrected["mlp_bytes"] > sizes[2]  # the bf16 correction counted
    assert records["dense-int8"]["quantization"]["method"] == "rtn"
    assert records["dense-int4-gptq"]["calibration"]["tokens"] == 4 * 32
    assert records["whiten-keep0.5-factors-int4"]["quantization"]["method"] == "gptq+refit"
    assert records["whiten-keep0.5-factors-int8"]["params"] == records["whiten-keep0.5"]["params"]
    dense = records["dense"]["perplexity"]
    for name in names[1:]:
        assert records[name]["perplexity"] != dense
    report = (out / "report.md").read_text()
    assert (
        "--quantize int8,int4-gptq,int3g16-asym-gptq+0.5 --factor-bits 16,8,4" in report
        and "| MLP MB |" in report
    )
    assert all(f"| {name} |" in report for name in names)
    assert (out / "memory-quality.png").stat().st_size > 0
    assert "Pareto front (no other point as small and as good): " in report

    # Resumed with the floating-point point finished, a width compresses again with its factors
    # quantized: the same point as made from the kept model.
    made = records["whiten-keep0.5-factors-int8"]
    (out / "points" / "whiten-keep0.5-factors-int8.json").unlink()
    assert main(argv) == 0
    assert len(compresses) == 2 and len(quantizations) == 2
    again = json.loads((out / "points" / "whiten-keep0.5-factors-int8.json").read_text())
    assert again["quantization"]["mlp_bytes"] == made["quantization"]["mlp_bytes"]
    for name, value in made["perplexity"].items():
        assert again["perplexity"][name] == pytest.approx(value, rel=1e-4)
    # GPTQ depends on the calibration windows, round to nearest does not.
    samples = argv.index("--calib-samples") + 1
    assert main(argv[:samples] + ["2"] + argv[samples + 1 :]) == 2
    assert "dense-int4-gptq.json was made with other compress" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_sweep_stopped_in_its_calibration_keeps_it(tmp_path, tokenizer, monkeypatch, capsys, where):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_dir = save_tiny_llama(tmp_path / "tiny-llama", tokenizer)
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    assert main(tiny_sweep_argv(model_dir, text, tmp_path / "whole", "0.5", "fisher")) == 0
    out = tmp_path / "out"
    argv = tiny_sweep_argv(model_dir, text, out, "0.5", "fisher")
    stop = forward_stopped_at(monkeypatch, 1) if where == "forward" else backward_stopped_at(monkeypatch, 0)
    with stop:
        assert main(argv) == 130
    kept = {"forward": "forward pass up to layer 1", "backward": "backward pass down to layer 1"}[where]
    assert output_grams.kept(out / ".calibration") == f"the calibration's {kept}"  # kept for the rerun
    forward = count_calls(monkeypatch, output_grams, "_forward_and_head")
    layers_kept = count_calls(monkeypatch, output_grams._LayerInputs, "put")
    assert main(argv) == 0
    assert len(forward) == (where == "forward") and len(layers_kept) == (where == "forward")  # layer 1's only
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    point = "fisher-keep0.5.json"
    whole = json.loads((tmp_path / "whole" / "points" / point).read_text())
    continued = json.loads((out / "points" / point).read_text())
    assert continued["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-5)


def test_a_stopped_sweep_continues_inside_the_point_it_stopped_in(tmp_path, tokenizer, monkeypatch, capsys):
    # Hours of a big model's point must survive a stop: its journal and the shared Grams stay on disk.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_dir = save_tiny_llama(tmp_path / "tiny-llama", tokenizer)
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    recipe = "fisher+allocate+sequential"
    assert main(tiny_sweep_argv(model_dir, text, tmp_path / "whole", "0.8,0.5", recipe)) == 0
    out = tmp_path / "out"
    argv = tiny_sweep_argv(model_dir, text, out, "0.8,0.5", recipe)
    first, layer, second = out / "points" / f"{recipe}-keep0.8.json", factorise.layer, []

    def stopped(model, spec, index, *args, **kwargs):
        if first.is_file():  # in the second point
            second.append(index)
            if len(second) == 2:
                raise KeyboardInterrupt
        return layer(model, spec, index, *args, **kwargs)

    collect = calibration_step.collect_shared

    def stopped_calibrating(run, spill):
        collect(run, spill=spill)  # its Grams spilled, not recorded
        raise KeyboardInterrupt

    monkeypatch.setattr(calibration_step, "collect_shared", stopped_calibrating)
    assert main(argv) == 130
    assert not (out / ".calibration").exists()  # nothing a rerun could use
    monkeypatch.setattr(calibration_step, "collect_shared", collect)
    monkeypatch.setattr(factorise, "layer", stopped)
    assert main(argv) == 130
    work = out / f".{recipe}-keep0.5.work"
    logged = capsys.readouterr()
    assert f"kept in {work}" in logged.out
    assert "sensitivity of keeps 0.8, 0.5: 100%" in logged.err  # measured by the first point
    stopped_run = json.loads((work / "progress.json").read_text())
    assert list(stopped_run["layers"]) == [str(second[0])]
    assert (out / ".calibration" / "progress.json").is_file()
    code, _, err = run_cli(capsys, *argv, "--calib-samples", "5")
    assert code == 2 and "holds a stopped compression of another plan" in err  # refused before any work
    assert (work / "progress.json").is_file()

    calibrations, resumed = count_calls(monkeypatch, calibration_step, "collect_shared"), []
    monkeypatch.setattr(factorise, "layer", lambda *a, **k: resumed.append(a[2]) or layer(*a, **k))
    assert main(argv) == 0
    assert f"continuing from {work}: allocation, 1 compressed layers done" in capsys.readouterr().out
    assert calibrations == [] and resumed[0] == second[1]
    assert second[0] not in resumed  # the layer done before the stop is not made again
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    for name in ("dense", f"{recipe}-keep0.8", f"{recipe}-keep0.5"):
        whole = json.loads((tmp_path / "whole" / "points" / f"{name}.json").read_text())
        continued = json.loads((out / "points" / f"{name}.json").read_text())
        assert continued["achieved_keep"] == whole["achieved_keep"]
        assert continued["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-5)
    # The continued point's time counts its stopped run's, as its journal recorded it when stopped.
    point = json.loads((out / "points" / f"{recipe}-keep0.5.json").read_text())
    for step, seconds in stopped_run["seconds"].items():
        assert point["timings"][step] >= seconds > 0, step
    assert point["compress_seconds"] == pytest.approx(sum(point["timings"].values()))


def test_a_sweeps_keeps_share_their_allocations_measurements_three_at_a_time(
    tmp_path, tokenizer, monkeypatch
):
    from svdmlp.compression import sensitivity

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_dir = save_tiny_llama(tmp_path / "tiny-llama", tokenizer)
    text = tmp_path / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    measure, passes = sensitivity.measure, []

    def slow(*args, **kwargs):  # each pass takes at least 1 s: the points' timings tell who made it
        passes.append(1)
        time.sleep(1.0)
        yield from measure(*args, **kwargs)

    monkeypatch.setattr(sensitivity, "measure", slow)
    probes = count_calls(monkeypatch, sensitivity.Probe, "divergence")
    argv = tiny_sweep_argv(model_dir, text, tmp_path / "out", "0.9,0.8,0.7,0.5", "svd+allocate")
    assert main(argv) == 0
    assert len(passes) == 2  # keeps 0.9-0.7 together, then 0.5 alone; the others' allocations only choose
    assert len(probes) == 4 * 2  # each keep probes each of the two layers once
    records = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "out" / "points").iterdir()}
    timings = {k: records[f"svd+allocate-keep{k}"]["timings"]["allocation"] for k in (0.9, 0.8, 0.7, 0.5)}
    assert timings[0.9] >= 1.0 and timings[0.5] >= 1.0  # the first point's time counts the pass it made
    assert timings[0.8] < 1.0 and timings[0.7] < 1.0  # choosing ranks from the measurements: milliseconds
    assert records["svd+allocate-keep0.9"]["compress_seconds"] > timings[0.9]
