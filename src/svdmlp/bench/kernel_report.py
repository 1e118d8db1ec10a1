"""Outputs of ``bench kernel``: a side-by-side table, the per-keep summary, a PNG plot."""

from __future__ import annotations

from pathlib import Path

from svdmlp.bench.kernel import QUANTIZED
from svdmlp.plots import new_figure, save_figure
from svdmlp.tables import format_table

SCHEMA = "svdmlp-bench-kernel/1"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _check(row: dict) -> str:
    if "fused" in row["errors"]:
        return "error"
    check = row["check"].get("fused")
    if check is None:
        return "-"
    return f"{'ok' if check['ok'] else 'FAIL'} {check['rel_err']:.1e}"


def format_rows(report: dict) -> str:
    """Ours vs dense vs unfused vs floor, one line per (model, keep, M), with ratios and % of floor."""
    compiled = any(row["time_s"]["compiled"] is not None for row in report["rows"])
    quantized = [name for name in QUANTIZED if any(row["time_s"][name] is not None for row in report["rows"])]
    header = ["model", "keep", "M", "r g/u/d", "µs fused"]
    header += [f"µs {name.replace('_', ' ')}" for name in quantized]
    header += ["µs dense", "µs unfused"]
    header += ["µs compiled"] if compiled else []
    header += ["µs floor dense", "µs floor lr", "fused/dense", "fused/unfused", "unfused/dense", "ideal"]
    header += ["%floor fused", "%floor dense", "%floor unfused", "check"]
    rows = []
    for row in report["rows"]:
        t, sp, pct, r = row["time_s"], row["speedup"], row["pct_of_floor"], row["ranks"]
        cells = [row["model"], f"{row['keep']:g}", str(row["m"]), f"{r['gate']}/{r['up']}/{r['down']}"]
        cells += [_us(t[name]) for name in ("fused", *quantized, "dense", "unfused")]
        cells += [_us(t["compiled"])] if compiled else []
        cells += [_us(row["floor_s"]["dense"]), _us(row["floor_s"]["lowrank"])]
        cells += [
            _x(sp["fused_vs_dense"]),
            _x(sp["fused_vs_unfused"]),
            _x(sp["unfused_vs_dense"]),
            _x(sp["ideal"]),
        ]
        cells += [_pct(pct["fused"]), _pct(pct["dense"]), _pct(pct["unfused"]), _check(row)]
        rows.append(cells)
    return format_table(header, rows)


def _stat(entry: dict | None) -> str:
    if entry is None:
        return "-"
    return f"mean {entry['mean']:.2f}x (min {entry['min']:.2f}, max {entry['max']:.2f}, n={entry['n']})"


def format_summary(report: dict) -> str:
    """Per keep: mean speedups over dense, % of floor overall and at decode, the worst fused row."""
    lines = []
    for keep, s in report["summary"].items():
        pct, decode = s["pct_of_floor"], s["decode_pct_of_floor"]
        lines.append(f"keep {keep} ({s['rows']} rows):")
        lines.append(f"  fused over dense:   {_stat(s['fused_vs_dense'])}")
        lines.append(f"  unfused over dense: {_stat(s['unfused_vs_dense'])}")
        lines.append(f"  backend (faster of the two) over dense: {_stat(s['backend_vs_dense'])}")
        if s["compiled_vs_dense"] is not None:
            lines.append(f"  compiled over dense: {_stat(s['compiled_vs_dense'])}")
        for name in QUANTIZED:
            if s[f"{name}_vs_dense"] is not None:
                lines.append(
                    f"  {name.replace('_', ' ')} (M <= 16) over dense: {_stat(s[f'{name}_vs_dense'])}; "
                    f"over fused: {_stat(s[f'{name}_vs_fused'])}"
                )
        lines.append(f"  ideal (floor ratio): {_stat(s['ideal'])}")
        lines.append(
            f"  % of floor, all M: fused {_pct(pct['fused'])}, dense {_pct(pct['dense'])}, "
            f"unfused {_pct(pct['unfused'])}; at M <= 16: fused {_pct(decode['fused'])}, "
            f"dense {_pct(decode['dense'])}, unfused {_pct(decode['unfused'])}"
        )
        if s["decode_fused_vs_dense"] is not None:
            lines.append(f"  fused over dense at M <= 16: mean {s['decode_fused_vs_dense']:.2f}x")
        worst = s.get("worst_vs_best_baseline")
        if worst:
            lines.append(
                f"  worst fused row vs the better of dense/unfused: {worst['speedup']:.2f}x "
                f"({worst['model']}, M={worst['m']})"
            )
        lines.append(
            f"  fused (float, int8, int4) and compiled outputs failing the check or raising: {s['check_failures']}"
        )
    if report["skipped"]:
        lines.append(f"{len(report['skipped'])} rows skipped (time budget spent): the means above omit them")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Speedup over dense vs M, one panel per keep, one line per model.

    Solid: the fused path (or the unfused PyTorch path where there is no fused one); dashed: the
    unfused path when the fused one is shown; dotted, in the model's colour: its ideal (the floor
    ratio), which differs between models because aligned ranks round each one's keep differently.
    """
    keeps = report["config"]["keeps"]
    models = list(dict.fromkeys(row["model"] for row in report["rows"]))
    has_fused = any(row["time_s"]["fused"] is not None for row in report["rows"])
    main = "fused_vs_dense" if has_fused else "unfused_vs_dense"
    figure, axes = new_figure((6 * len(keeps), 4.5), panels=len(keeps))
    for ax, keep in zip(axes, keeps, strict=True):
        rows = [row for row in report["rows"] if row["keep"] == keep]
        for index, model in enumerate(models):
            mine = sorted((row for row in rows if row["model"] == model), key=lambda row: row["m"])
            color = f"C{index % 10}"
            points = [(row["m"], row["speedup"][main]) for row in mine if row["speedup"][main] is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", color=color, label=model)
            if has_fused:
                dashed = [
                    (row["m"], row["speedup"]["unfused_vs_dense"])
                    for row in mine
                    if row["speedup"]["unfused_vs_dense"]
                ]
                if dashed:
                    ax.plot(*zip(*dashed, strict=True), linestyle="--", color=color, alpha=0.6)
            if mine:
                ideal = [(row["m"], row["speedup"]["ideal"]) for row in mine]
                ax.plot(*zip(*ideal, strict=True), linestyle=":", color=color, alpha=0.8)
        if rows:
            ax.plot([], [], linestyle=":", color="grey", label="ideal (floor ratio)")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens M")
        ax.set_ylabel("speedup over dense")
        ax.set_title(
            f"keep {keep:g}: {'fused (solid), unfused (dashed)' if has_fused else 'unfused PyTorch'}"
        )
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    device = report["environment"]["device"]["name"]
    save_figure(figure, path, f"svdmlp bench kernel on {device} ({report['config']['dtype']})")
