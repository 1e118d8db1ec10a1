"""A sweep's Markdown report with PNG plots, rebuilt from its point records alone.

The command that made the sweep heads the report, so that the numbers can be regenerated; the plots
put perplexity (log scale: plain SVD on small models reaches 10^5 and more) and accuracy against the
*achieved* keep, since alignment moves every point off its target, one line per recipe and factor
width, the dense model and its quantized baselines as level lines; and, with more than one text, the
MLP's bytes against the geometric-mean ratio to dense (``memory-quality.png``), where compression and
quantization meet at equal bytes. With a ``bench e2e`` file (``--bench``), a section pairs each
benchmarked keep's decode speedup with the sweep's perplexity.
"""

from __future__ import annotations

import re
from pathlib import Path

from svdmlp.config import FACTOR_BITS
from svdmlp.evaluate import harness, suite
from svdmlp.paths import write_output
from svdmlp.plots import new_figure, save_figure
from svdmlp.quantize import Quantization
from svdmlp.sweep import speed
from svdmlp.sweep.points import mlp_bytes
from svdmlp.tables import format_cell, markdown_table

SPEED_PLOT = "ppl-vs-speed.png"
MEMORY_PLOT = "memory-quality.png"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", Path(name).stem if "/" in name else name).strip("-")


def series(record: dict) -> str:
    """What a point is a point of: ``dense``, a dense baseline (``dense int4 GPTQ``, ``dense int3-asym
    GPTQ + correction 0.05``), or a recipe with
    its factors' width (``whiten``, ``whiten, factors int8``): one line in the plots."""
    if record["method"] == "dense":
        if not record.get("quantize"):
            return "dense"
        return f"dense {Quantization.parse(record['quantize']).label}"
    bits = record.get("factor_bits", 16)
    return record["method"] if bits == 16 else f"{record['method']}, factors {FACTOR_BITS[bits]}"


def _compressed_series(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(series(r) for r in records if r["method"] != "dense"))


def _dense(records: list[dict]) -> dict | None:
    return next((r for r in records if r["point"] == "dense"), None)


def plot_perplexity(records: list[dict], text: str, path: Path) -> None:
    """Perplexity vs achieved keep, one line per recipe and factor width; the dense model as a dashed
    line and each quantized baseline as a dotted one."""
    figure, axes = new_figure((6, 4))
    for name in _compressed_series(records):
        points = sorted((r["achieved_keep"], r["perplexity"][text]) for r in records if series(r) == name)
        axes.plot(*zip(*points, strict=True), marker="o", label=name)
    for r in records:
        if r["point"] == "dense":
            axes.axhline(r["perplexity"][text], color="black", linestyle="--", label="dense")
        elif r["method"] == "dense":
            axes.axhline(r["perplexity"][text], color="grey", linestyle=":", label=series(r))
    axes.set(xlabel="achieved keep (fraction of MLP parameters)", ylabel="perplexity", yscale="log")
    axes.set_title(f"perplexity on {text}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    save_figure(figure, path)


def plot_accuracy(records: list[dict], task: str, path: Path) -> None:
    """acc (solid) and acc_norm (dotted) vs achieved keep, one colour per series (:func:`series`)."""
    figure, axes = new_figure((6, 4))
    names = list(dict.fromkeys(series(r) for r in records))  # dense first
    for index, name in enumerate(names):
        rows = sorted((r for r in records if series(r) == name), key=lambda r: r["achieved_keep"])
        for metric, style in zip(harness.METRICS, ("-", ":"), strict=True):
            points = [
                (r["achieved_keep"], r["tasks"][task]["metrics"][metric])
                for r in rows
                if metric in r["tasks"][task]["metrics"]
            ]
            if points:
                axes.plot(
                    *zip(*points, strict=True),
                    marker="o",
                    linestyle=style,
                    color=f"C{index}",
                    label=f"{name} {metric}",
                )
    axes.set(xlabel="achieved keep (fraction of MLP parameters)", ylabel="accuracy", title=task)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    save_figure(figure, path)


def pareto_front(points: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """The points of ``(label, megabytes, ratio)`` that no other point beats on both axes (as small or
    smaller and as good or better, one of the two strictly), from the fewest bytes up: what a user
    choosing by size and quality would ever pick."""
    front = [
        p
        for p in points
        if not any(q[1] <= p[1] and q[2] <= p[2] and (q[1], q[2]) != (p[1], p[2]) for q in points)
    ]
    return sorted(front, key=lambda p: (p[1], p[2]))


def plot_memory_quality(points: list[tuple[str, float, float]], path: Path, title: str) -> None:
    """Each ``(label, MLP megabytes, geometric-mean perplexity ratio to dense)`` as a labelled dot, the
    Pareto front (:func:`pareto_front`) as a step line through its points."""
    figure, axes = new_figure((6.5, 4.5))
    for label, megabytes, ratio in points:
        axes.scatter([megabytes], [ratio])
        axes.annotate(label, (megabytes, ratio), fontsize=7, xytext=(4, 2), textcoords="offset points")
    front = pareto_front(points)
    axes.step(
        [p[1] for p in front],
        [p[2] for p in front],
        where="post",
        color="grey",
        alpha=0.6,
        label="Pareto front",
    )
    axes.legend(fontsize="small")
    axes.set_xlabel("MLP megabytes (scales included)")
    axes.set_ylabel("perplexity / dense, geometric mean over the texts")
    axes.grid(True, alpha=0.3)
    save_figure(figure, path, title)


def _memory_points(records: list[dict]) -> list[tuple[str, float, float]]:
    """The points of :func:`plot_memory_quality`: every record whose MLP bytes are known."""
    dense = _dense(records)
    methods = {r["method"] for r in records if r["method"] != "dense"}
    found = []
    for r in records:
        size = mlp_bytes(r)
        if size is None:
            continue
        label = series(r)
        if r["method"] != "dense":  # a recipe's name is long: its keep, the recipe only where several ran
            width = label.removeprefix(r["method"])  # ", factors int8" or nothing
            label = ("" if len(methods) == 1 else f"{r['method']} ") + f"keep {r['target_keep']:g}{width}"
        geomean = suite.ratios_to_dense(dense["perplexity"], r["perplexity"])["geomean"]
        found.append((label, size / 1e6, geomean))
    return found


def plot_speed(comparison: speed.Comparison, texts: list[str], path: Path) -> None:
    """Perplexity vs decode speedup over dense, one line per text through dense and the keeps in
    falling order, each point labelled with its keep."""
    batch = comparison.plot_batch
    pairings = [p for p in comparison.pairings if batch in p.decode]  # dense, then keeps falling
    figure, axes = new_figure((6, 4))
    for index, text in enumerate(texts):
        xs = [p.decode[batch][0] for p in pairings]
        ys = [p.record["perplexity"][text] for p in pairings]
        axes.plot(xs, ys, marker="o", color=f"C{index}", label=text)
        for p, x, y in zip(pairings, xs, ys, strict=True):
            label = p.label if p.exact else f"{p.label} (PPL at {p.record['target_keep']:g})"
            axes.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set(xlabel=f"decode speedup over dense (batch {batch})", ylabel="perplexity", yscale="log")
    axes.set_title(f"{comparison.method}: perplexity vs decode speed", fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    save_figure(figure, path)


def speed_section(out: Path, records: list[dict], bench: speed.Bench) -> list[str]:
    """The "Speed vs quality" section: provenance, pairings, the table, and ``ppl-vs-speed.png``."""
    sweep = records[0]["sweep"]
    texts, comparison = sweep["texts"], speed.compare(bench, records)
    if speed.same_model(comparison.model, sweep["model"]):
        measured = f"{comparison.model}, the sweep's model"
    else:
        measured = f"{comparison.model}, **not** the sweep's model (the speedups are that model's)"
    pairs = ", ".join(
        f"{p.label} → {p.record['point']} ({'same' if p.exact else 'nearest'} target keep, "
        f"achieved {p.record['achieved_keep']:.4f})"
        for p in comparison.pairings
        if p.keep is not None
    )
    lines = [
        "## Speed vs quality",
        "",
        f"- Speeds: {bench.provenance()}.",
        f"- Model benchmarked: {measured}.",
        "- decode B=N: speedup over dense of one decode step at batch N (N new tokens, one per sequence), "
        "its ms in brackets; the bench times random factors of the ranks its keep gives.",
    ]
    if comparison.has_ideal:
        lines.append(
            "- ideal: dense weight bytes over the variant's, the speedup of a purely weight-streaming decode."
        )
    lines.append(f"- Perplexity of the {comparison.method} point paired with each bench keep: {pairs}.")
    bench_align = bench.config.get("align")
    if bench_align is not None and bench_align != sweep["compress"]["align"]:
        lines.append(
            f"- The bench aligned ranks to {bench_align}, the sweep to {sweep['compress']['align']}: "
            "the ranks timed are not exactly the ranks scored."
        )
    headers = ["bench keep", "point", "achieved keep"] + [f"decode B={b}" for b in comparison.batches]
    headers += ["ideal"] if comparison.has_ideal else []
    headers += [f"PPL {t}" for t in texts]
    rows = []
    for p in comparison.pairings:
        cells = [
            p.label,
            p.record["point"] + ("" if p.exact else " (nearest)"),
            f"{p.record['achieved_keep']:.4f}",
        ]
        for batch in comparison.batches:
            cells.append(
                f"{p.decode[batch][0]:.2f}x ({p.decode[batch][1] * 1e3:.3g} ms)" if batch in p.decode else "-"
            )
        cells += [f"{p.ideal:.2f}x"] if comparison.has_ideal else []
        cells += [p.record["perplexity"][t] for t in texts]
        rows.append(cells)
    lines += ["", markdown_table(headers, rows)]
    plot_speed(comparison, texts, out / SPEED_PLOT)
    return lines + ["", f"![perplexity vs decode speedup]({SPEED_PLOT})", ""]


def write_report(out: Path, records: list[dict], command: str, bench: speed.Bench | None = None) -> Path:
    """Write ``OUT/report.md`` and its plots (with ``bench``: the speed-vs-quality section); return its path."""
    sweep = records[0]["sweep"]
    texts, tasks = sweep["texts"], sweep["settings"]["tasks"]
    lines = [
        f"# Sweep: {sweep['model']}",
        "",
        "Generated by:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"- {suite.KEEP_DEFINITION}.",
        "- target keep is what was asked; achieved keep is the MLP's kept fraction after rank alignment "
        f"(align {sweep['compress']['align']}).",
        f"- Perplexity: {_protocol(sweep, records)}.",
        f"- Calibration (whiten): {_calibration(sweep['compress'])}" + _calibration_hash(records) + ".",
        "- MLP MB: the MLP's bytes, packed with their fp16 scales where quantized, else two per parameter "
        "(bf16, as checkpoints are saved); quantized factors leave the layers the allocation kept dense in bf16.",
        "- compress s: wall seconds of compression (with the rounding, for quantized weights), with what "
        "the point made for the points after it too (the output-gradient Grams, the allocation's "
        "measurements, the whitenings): the first point of a run pays for what the others reuse. A point "
        "continued after a stop counts its stopped runs' seconds too, as its journal recorded them, which "
        "may come from differently loaded machines.",
        "",
        _table(records, texts, tasks),
        "",
    ]
    for text in texts:
        name = f"ppl-{_slug(text)}.png"
        plot_perplexity(records, text, out / name)
        lines += [f"![perplexity on {text}]({name})", ""]
    memory = _memory_points(records) if _dense(records) is not None and len(texts) > 1 else []
    if len(memory) > 1:
        plot_memory_quality(memory, out / MEMORY_PLOT, f"memory against quality: {sweep['model']}")
        front = ", ".join(
            f"{label} ({megabytes:.1f} MB, ×{ratio:.3f})" for label, megabytes, ratio in pareto_front(memory)
        )
        lines += [
            f"![MLP bytes against the geometric-mean perplexity ratio]({MEMORY_PLOT})",
            "",
            f"Pareto front (no other point as small and as good): {front}.",
            "",
        ]
    for task in tasks:
        if all(not r["tasks"][task]["error"] for r in records):
            name = f"acc-{_slug(task)}.png"
            plot_accuracy(records, task, out / name)
            lines += [f"![{task}]({name})", ""]
    if bench is not None:
        lines += speed_section(out, records, bench)
    failed = suite.failures([{**r, "kind": r["point"]} for r in records])
    if failed:
        lines += ["## Failed tasks", "", *(f"- {line}" for line in failed), ""]
    return write_output(out / "report.md", "\n".join(lines))


def _protocol(sweep: dict, records: list[dict]) -> str:
    """The protocol line of the sweep's settings and of the BOS its dense point was scored with
    (records from before the BOS was recorded had none)."""
    dense = _dense(records) or records[0]
    bos = dense.get("bos", {"token_id": None, "convention": None})
    settings = suite.EvalSettings(**sweep["settings"])
    return settings.protocol(sweep["dtype"], "the CPU", bos["token_id"], bos["convention"])


def _calibration(compress: dict) -> str:
    spec = compress["calibration"]
    return f"{spec['num_samples']} windows of {spec['seq_len']} tokens of {spec['source']}, seed {compress['seed']}"


def _calibration_hash(records: list[dict]) -> str:
    hashes = {r["calibration"].get("sha256") for r in records if r.get("calibration")}
    return f" (token SHA-256 {', '.join(h[:16] for h in sorted(hashes))}…)" if hashes else ""


def _groups(dense: dict, records: list[dict]) -> list[str]:
    """The groups of texts (:func:`svdmlp.corpora.group_of`) that get a column of their own: every one
    found, when the texts fall in more than one."""
    found = {g for r in records for g in suite.ratios_to_dense(dense, r["perplexity"])["groups"]}
    return sorted(found) if len(found) > 1 else []


def _table(records: list[dict], texts: list[str], tasks: list[str]) -> str:
    """One row per point: perplexity per text with its ratio to dense, and their geometric mean."""
    dense = (_dense(records) or {}).get("perplexity")
    headers = ["point", "target keep", "achieved keep", "MLP MB", "compress s"] + [f"PPL {t}" for t in texts]
    geomean = dense is not None and len(texts) > 1
    groups = _groups(dense, records) if geomean else []
    headers += [f"geomean ×dense, {g}" for g in groups] + (["geomean ×dense"] if geomean else [])
    headers += [f"{task} {metric}" for task in tasks for metric in harness.METRICS]
    rows = []
    for r in records:
        size = mlp_bytes(r)
        cells = [
            r["point"],
            r["target_keep"],
            f"{r['achieved_keep']:.4f}",
            "" if size is None else f"{size / 1e6:.1f}",
        ]
        cells.append(f"{r['compress_seconds']:.1f}")
        summary = suite.ratios_to_dense(dense, r["perplexity"]) if dense is not None else None
        for t in texts:
            ppl = format_cell(r["perplexity"][t])
            cells.append(
                ppl if summary is None or r["point"] == "dense" else f"{ppl} (×{summary['ratios'][t]:.3g})"
            )
        if geomean:
            cells += [
                f"×{summary['groups'][g]['geomean']:.3g}" if g in summary["groups"] else "" for g in groups
            ]
            cells.append(f"×{summary['geomean']:.3g}")
        for task in tasks:
            result = r["tasks"][task]
            cells += ["failed" if result["error"] else result["metrics"].get(m, "-") for m in harness.METRICS]
        rows.append(cells)
    return markdown_table(headers, rows)
