"""The results table across model sizes (docs/results/sizes) and its plot, from a manifest of scored runs.

    python benchmarks/sizes_table.py docs/results/sizes/rows.json --plot docs/results/sizes/ratios.png

The manifest is a JSON list; each row names ``model``, ``keep`` (the target), ``dense`` and ``result``
(paths relative to the manifest: a sweep point or an ``svdmlp eval --json`` file, read as
``ratio_table.py`` reads them), and optionally ``note`` (how the row's recipe differs from today's
default), ``scoring`` (how its scoring differs from 16 windows of 512 tokens a text), ``compress`` and
``peak`` (as measured, in words). Prints the Markdown table: each text's ratio to the
same model dense on the same windows, the geometric means over the built-in domains and over all texts.
The plot draws the domains' geometric mean against keep for each model and recipe, and each text's ratio
at keep 0.8 for the rows without a note (today's default recipe).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib import colormaps
from matplotlib.ticker import FuncFormatter
from ratio_table import ratios_of, read_row

from svdmlp.corpora import HELDOUT_SOURCES
from svdmlp.plots import new_figure, save_figure
from svdmlp.tables import markdown_table


def scored(manifest: Path) -> list[dict]:
    """Every manifest row with ``ratios`` (per text), ``domains`` and ``all`` (geometric means) and
    ``achieved`` (the keep reached) added; every row must have scored the same texts as its dense one."""
    rows = []
    for entry in json.loads(manifest.read_text()):
        dense = read_row(str(manifest.parent / entry["dense"]), first=True)["perplexity"]
        result = read_row(str(manifest.parent / entry["result"]))
        if sorted(result["perplexity"]) != sorted(dense):
            raise SystemExit(f"{entry['result']} scored other texts than {entry['dense']}")
        ratios = ratios_of(dense, result["perplexity"])
        rows.append({**entry, **ratios, "achieved": result.get("achieved_keep", 1.0)})
    return rows


def _texts(rows: list[dict]) -> list[str]:
    """Every text the rows scored: the built-in domains first, in their order, then the others."""
    names = list(dict.fromkeys(n for row in rows for n in row["ratios"]))
    return [n for n in HELDOUT_SOURCES if n in names] + [n for n in names if n not in HELDOUT_SOURCES]


def table(rows: list[dict]) -> str:
    names = _texts(rows)
    headers = ["model", "keep (achieved)", *names, "geomean domains", "geomean all", "compress", "peak RSS"]
    lines = []
    for row in rows:
        notes = [row[key] for key in ("note", "scoring") if row.get(key)]
        keep = ", ".join([f"{row['keep']:g} ({row['achieved']:.4f})", *notes])
        cells = [f"×{row['ratios'][n]:.2f}" if n in row["ratios"] else "-" for n in names]
        cells += [
            f"×{row['domains']:.3f}",
            f"×{row['all']:.3f}",
            row.get("compress", "-"),
            row.get("peak", "-"),
        ]
        lines.append([row["model"], keep, *cells])
    return markdown_table(headers, lines)


def plot(rows: list[dict], path: Path) -> None:
    """Left: the domains' geometric mean against the achieved keep, one line per model and recipe.
    Right: each text's ratio at keep 0.8 with the default recipe, one bar per model (its last row without
    a note or noted only as a sweep's: a sweep point is the same recipe)."""
    figure, (left, right) = new_figure((13, 4.8), panels=2)
    series = {}
    for row in rows:
        label = row["model"] + (f" ({row['note']})" if row.get("note") else "")
        series.setdefault(label, []).append((row["achieved"], row["domains"]))
    colours = colormaps["tab20"].colors  # more series than the default cycle's ten colours
    for number, (label, points) in enumerate(series.items()):
        points.sort()
        xs, ys = [k for k, _ in points], [g for _, g in points]
        left.plot(xs, ys, marker="o", label=label, color=colours[number % len(colours)])
    left.set_xlabel("keep (fraction of MLP parameters kept)")
    left.set_ylabel("perplexity / dense, geometric mean over the domains")
    left.set_yscale("log")
    left.invert_xaxis()
    left.legend(fontsize="small")
    default = {
        row["model"]: row for row in rows if row["keep"] == 0.8 and row.get("note", "sweep") == "sweep"
    }
    at = list(default.values())
    names = _texts(at)
    width = 0.8 / max(len(at), 1)
    for number, row in enumerate(at):
        xs = [i + (number - (len(at) - 1) / 2) * width for i in range(len(names))]
        right.bar(xs, [row["ratios"].get(n, float("nan")) for n in names], width, label=row["model"])
    right.set_xticks(range(len(names)), names, rotation=30, ha="right")
    right.set_ylabel("perplexity / dense at keep 0.8, default recipe")
    right.set_yscale("log")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.legend(fontsize="small")
    for axes in (left, right):  # plain "x1.5" labels on the log axes, not powers of ten
        axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"x{y:g}"))
        axes.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"x{y:g}"))
    save_figure(figure, path, "The default recipe across model sizes (MLP only)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--plot", type=Path, help="also draw the figure to this PNG")
    args = parser.parse_args()
    rows = scored(args.manifest)
    print(table(rows))
    if args.plot is not None:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
