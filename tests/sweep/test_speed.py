"""``svdmlp sweep --bench FILE``: a real ``bench e2e --json`` file of the tiny model paired with a finished
sweep: the speed-vs-quality table and plot, added by a rerun that recomputes nothing, and bad files
refused in one line before any work."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest
import torch

from conftest import SAMPLE_TEXT, count_calls, save_tiny_llama, tiny_sweep_argv
from svdmlp import models
from svdmlp.bench import e2e
from svdmlp.cli import main
from svdmlp.compression import pipeline
from svdmlp.compression.steps import calibration as calibration_step
from svdmlp.sweep import markdown as report
from svdmlp.sweep import speed
from svdmlp.tables import format_cell

POINTS = ["dense", "whiten-keep0.8", "whiten-keep0.5"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tokenizer):
    """``bench e2e`` (keeps 0.8 and 0.6, batches 1 and 2) and a whitened sweep (keeps 0.8 and 0.5) of
    one tiny Llama, both run once for the module."""
    root = tmp_path_factory.mktemp("sweep-bench")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        # The real bandwidth measurement, on a 1 MiB copy instead of 128 MiB.
        real = e2e.measure_ceilings
        patch.setattr(e2e, "measure_ceilings", lambda device, dtype, *sizes: real(device, dtype, 1 << 20, 64))
        model_dir = str(save_tiny_llama(root / "tiny-llama", tokenizer))
        bench = root / "e2e.json"
        argv = ["bench", "e2e", model_dir, "--keep", "0.8,0.6", "--batch", "1,2", "--align", "8"]
        argv += ["--prompt-len", "8", "--new-tokens", "3", "--repeats", "1", "--no-hf", "--json", str(bench)]
        assert main(argv) == 0
        text = root / "text.txt"
        text.write_text(SAMPLE_TEXT, encoding="utf-8")
        sweep = tiny_sweep_argv(model_dir, text, root / "out", "0.8,0.5", "whiten")
        assert main(sweep) == 0
    torch.set_num_threads(threads)
    return SimpleNamespace(root=root, bench=bench, argv=sweep, out=root / "out", text=str(text))


def records(out) -> list[dict]:
    return [json.loads((out / "points" / f"{p}.json").read_text()) for p in POINTS]


def test_rerun_with_bench_adds_speed_vs_quality_without_recomputing(finished, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    work = [count_calls(monkeypatch, models, "load_dense")]
    work += [
        count_calls(monkeypatch, pipeline, "compress"),
        count_calls(monkeypatch, calibration_step, "collect_shared"),
    ]
    (finished.out / report.SPEED_PLOT).unlink(missing_ok=True)
    capsys.readouterr()
    assert main([*finished.argv, "--bench", str(finished.bench)]) == 0
    assert work == [[], [], []]
    assert capsys.readouterr().out.count("finished earlier, skipped") == len(POINTS)

    text = (finished.out / "report.md").read_text()
    command = text.splitlines()[5]
    assert command.startswith("svdmlp sweep ") and f"--bench {finished.bench}" in command
    data = json.loads(finished.bench.read_text())
    environment = data["environment"]
    assert "## Speed vs quality" in text
    assert f"`svdmlp bench e2e` on {environment['device']['name']} (cpu)" in text
    assert f"dated {environment['timestamp']}" in text and f"file `{finished.bench}`" in text
    assert "the sweep's model" in text and "**not**" not in text
    assert "0.8 → whiten-keep0.8 (same target keep" in text
    assert "0.6 → whiten-keep0.5 (nearest target keep" in text

    lines = text.splitlines()
    header = f"| bench keep | point | achieved keep | decode B=1 | decode B=2 | ideal | PPL {finished.text} |"
    assert header in lines
    table = lines[lines.index(header) + 2 : lines.index(header) + 5]
    rows = {(r["keep"], r["batch"]): r for r in data["rows"]}
    by_point = {r["point"]: r for r in records(finished.out)}
    expected = [(None, "dense", "dense"), (0.8, "0.8", "whiten-keep0.8"), (0.6, "0.6", "whiten-keep0.5")]
    for line, (keep, label, point) in zip(table, expected, strict=True):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[0] == label and cells[1].startswith(point)
        assert cells[1].endswith("(nearest)") == (keep == 0.6)
        assert cells[2] == f"{by_point[point]['achieved_keep']:.4f}"
        for cell, batch in zip(cells[3:5], (1, 2), strict=True):
            speedup = rows[(None, batch)]["decode_s_per_step"] / rows[(keep, batch)]["decode_s_per_step"]
            ms = rows[(keep, batch)]["decode_s_per_step"] * 1e3
            assert cell == f"{speedup:.2f}x ({ms:.3g} ms)"
        assert cells[5] == f"{rows[(keep, 1)]['ideal_speedup']:.2f}x"
        assert cells[6] == format_cell(by_point[point]["perplexity"][finished.text])
    assert cells[5] != "1.00x"  # keep 0.6 streams fewer bytes than dense

    assert "![perplexity vs decode speedup](ppl-vs-speed.png)" in text
    assert (finished.out / "ppl-vs-speed.png").read_bytes()[:4] == b"\x89PNG"

    # The command at the report's head reproduces it, bench included, from the finished points.
    first = text
    assert main(shlex.split(command)[1:]) == 0
    assert work == [[], [], []] and (finished.out / "report.md").read_text() == first


def test_bench_file_errors_are_one_line_before_any_work(finished, tmp_path, capsys):
    good = json.loads(finished.bench.read_text())

    def variant(name: str, change) -> str:
        data = json.loads(json.dumps(good))
        change(data)
        path = tmp_path / name
        path.write_text(json.dumps(data))
        return str(path)

    (tmp_path / "broken.json").write_text('{"schema": "svdmlp-bench-e2e/1", "rows": [')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "folder").mkdir()
    cases = [
        (str(tmp_path / "gone.json"), "no such file"),
        (str(tmp_path / "folder"), "not a file"),
        (str(tmp_path / "broken.json"), "not JSON (Expecting value at line 1)"),
        (
            variant("kernel.json", lambda d: d.update(schema="svdmlp-bench-kernel/1")),
            "not a `svdmlp bench e2e --json` file (schema 'svdmlp-bench-kernel/1', expected "
            "'svdmlp-bench-e2e/1')",
        ),
        (variant("unnamed.json", lambda d: d.pop("schema")), "(schema None"),
        (str(tmp_path / "list.json"), "(schema None"),
        (variant("empty.json", lambda d: d.update(rows=[])), "no rows"),
        (
            variant("step.json", lambda d: d["rows"][1].pop("decode_s_per_step")),
            "row 1 has decode_s_per_step None",
        ),
        (variant("keep.json", lambda d: d["rows"][1].update(keep=1.5)), "row 1 has keep 1.5"),
        (
            variant("dense.json", lambda d: d.update(rows=[r for r in d["rows"] if r["keep"] is None])),
            "only dense rows",
        ),
        (
            variant(
                "nodense.json",
                lambda d: d.update(rows=[r for r in d["rows"] if r["keep"] or r["batch"] == 1]),
            ),
            "at batch 2 but no dense row there",
        ),
    ]
    argv = [a if a != str(finished.out) else str(tmp_path / "fresh") for a in finished.argv]
    for path, message in cases:
        assert main([*argv, "--bench", path]) == 2, message
        err = capsys.readouterr().err
        assert err.startswith(f"svdmlp sweep: error: --bench {path}: "), err
        assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "fresh").exists()  # refused before any point was computed


def test_ideal_column_only_when_the_file_has_bytes_and_another_model_is_named(finished, tmp_path):
    data = json.loads(finished.bench.read_text())
    for row in data["rows"]:
        row["model"] = "some/other-model"
        ideal = row.pop("ideal_speedup")
        row["expected_ideal"] = ideal
    (tmp_path / "bytes.json").write_text(json.dumps(data))
    comparison = speed.compare(speed.load(tmp_path / "bytes.json"), records(finished.out))
    assert comparison.has_ideal and comparison.model == "some/other-model"
    for pairing in comparison.pairings:  # recomputed from weight_bytes: the same ratio
        row = next(r for r in data["rows"] if r["keep"] == pairing.keep)
        assert pairing.ideal == pytest.approx(row["expected_ideal"])

    for row in data["rows"]:
        del row["weight_bytes"]
    (tmp_path / "none.json").write_text(json.dumps(data))
    bench = speed.load(tmp_path / "none.json")
    out = tmp_path / "out"
    out.mkdir()
    text = report.write_report(out, records(finished.out), "svdmlp sweep ...", bench).read_text()
    assert "| bench keep | point | achieved keep | decode B=1 | decode B=2 | PPL" in text
    assert "| ideal |" not in text and "- ideal:" not in text
    assert "some/other-model, **not** the sweep's model" in text
    assert (out / "ppl-vs-speed.png").is_file()


def test_nearest_point_prefers_the_same_keep_then_the_smaller():
    points = [
        {"method": "dense", "target_keep": 1.0},
        {"method": "svd", "target_keep": 0.65},
        {"method": "whiten", "target_keep": 0.7},
        {"method": "whiten", "target_keep": 0.6},
    ]
    assert speed.method_of(points) == "whiten" and speed.method_of(points[:2]) == "svd"
    assert speed.nearest(points, "whiten", 0.7) == (points[2], True)
    assert speed.nearest(points, "whiten", 0.65) == (points[3], False)  # a tie: the smaller keep
    assert speed.nearest(points, "whiten", 0.9) == (points[2], False)
