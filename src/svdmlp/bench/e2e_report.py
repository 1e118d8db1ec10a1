"""Outputs of ``bench e2e``: the table, the dense-vs-compressed summary, a PNG plot."""

from __future__ import annotations

from pathlib import Path

from svdmlp.plots import new_figure, save_figure
from svdmlp.tables import format_table

SCHEMA = "svdmlp-bench-e2e/1"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def format_rows(report: dict) -> str:
    """One line per (model, variant, batch): prefill, decode, floor, % of floor, speedups."""
    header = ["model", "variant", "batch", "prefill tok/s", "decode ms/step", "decode tok/s"]
    header += ["floor ms", "% floor", "vs dense", "ideal", "HF ms/step", "engine vs HF", "J/token", "$/Mtok"]
    header += ["graph"]
    body = []
    for row in report["rows"]:
        body.append(
            [
                row["model"],
                row["variant"],
                row["batch"],
                f"{row['prefill_tokens_per_s']:,.0f}",
                _ms(row["decode_s_per_step"]),
                f"{row['decode_tokens_per_s']:,.1f}",
                _ms(row["floor_s"]),
                f"{row['pct_of_floor']:.0f}%",
                f"{row['speedup_vs_dense']:.2f}x",
                f"{row['ideal_speedup']:.2f}x",
                _ms(row.get("hf_decode_s_per_step")),
                "-" if row.get("engine_vs_hf") is None else f"{row['engine_vs_hf']:.2f}x",
                "-" if row.get("joules_per_token") is None else f"{row['joules_per_token']:.3f}",
                "-"
                if row.get("dollars_per_million_tokens") is None
                else f"{row['dollars_per_million_tokens']:.2f}",
                ("yes" if row["graph"] else "no") + (", compiled" if row.get("compiled") else ""),
            ]
        )
    return format_table(header, body)


def format_summary(report: dict) -> str:
    """Per model and batch: each variant's decode speedup over dense against the ideal (bytes ratio)."""
    lines = []
    for row in report["rows"]:
        if row["variant"] == "dense":
            continue
        lines.append(
            f"{row['model']} {row['variant']} batch {row['batch']}: decode {row['speedup_vs_dense']:.2f}x "
            f"faster than dense (ideal {row['ideal_speedup']:.2f}x), {row['pct_of_floor']:.0f}% of its floor"
        )
    notes = {row["note"] for row in report["rows"] if row["note"]}
    notes |= {f"no energy: {row['energy_note']}" for row in report["rows"] if row.get("energy_note")}
    lines += [f"note: {note}" for note in sorted(notes)]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Decode ms/step per variant, one panel per (model, batch), with each variant's floor as a tick."""
    panels = list(dict.fromkeys((row["model"], row["batch"]) for row in report["rows"]))
    figure, axes = new_figure((4.5 * len(panels), 4), panels=len(panels))
    for ax, (model, batch) in zip(axes, panels, strict=True):
        rows = [row for row in report["rows"] if row["model"] == model and row["batch"] == batch]
        names = [row["variant"] for row in rows]
        times = [row["decode_s_per_step"] * 1e3 for row in rows]
        floors = [row["floor_s"] * 1e3 for row in rows]
        ax.bar(names, times, color=[f"C{i}" for i in range(len(rows))])
        ax.scatter(names, floors, marker="_", s=600, color="black", label="weight-streaming floor")
        for x, row in enumerate(rows):
            ax.annotate(
                f"{row['speedup_vs_dense']:.2f}x", (x, times[x]), ha="center", va="bottom", fontsize=8
            )
        ax.set_title(f"{model}, batch {batch}", fontsize=9)
        ax.set_ylabel("decode ms/step")
        ax.legend(fontsize=7)
    device = report["environment"]["device"]["name"]
    save_figure(figure, path, f"svdmlp bench e2e on {device} ({report['config']['dtype']})")
