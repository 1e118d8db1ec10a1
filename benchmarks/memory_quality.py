"""MLP bytes against quality: dense, quantized, compressed, and compressed with quantized factors.

    python benchmarks/memory_quality.py DENSE_EVAL.json OUT.png LABEL=FILE[@ROW] [LABEL=FILE[@ROW] ...]

``DENSE_EVAL.json`` is an ``svdmlp eval --json`` file whose first row is the dense model, scored on the
texts of every point. Each point is a row of an eval file (the last unless ``@ROW`` gives its index) or
a point of a sweep (``OUT/points/NAME.json``). Its MLP bytes: the packed bytes of a quantized row
(``--quantize``, or factors stored quantized), else two per MLP parameter (bf16, as checkpoints are
saved); the dense model's own point is its first row at 2 bytes per MLP parameter, which
``--dense-mlp-params N`` gives when the file does not. Prints a Markdown table (bytes, each text's ratio
to dense, "–" for a text the point was not scored on, the geometric means over the built-in domains and,
where every text was scored, over all of them) and draws the domains' geometric mean against the MLP
megabytes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from svdmlp.compression.report import mlp_bytes
from svdmlp.corpora import HELDOUT_SOURCES
from svdmlp.evaluate.suite import ratios_to_dense
from svdmlp.sweep.markdown import plot_memory_quality
from svdmlp.tables import markdown_table


def _row(spec: str) -> dict:
    """An eval row or a sweep's point: both record ``params`` and ``quantization`` alike."""
    path, _, index = spec.partition("@")
    data = json.loads(Path(path).read_text())
    return data["rows"][int(index) if index else -1] if "rows" in data else data


def _megabytes(label: str, row: dict, dense_params: int | None) -> float:
    params = row.get("params")
    # eval files written before 2026-12-07 recorded the total as "params" and the MLP's apart
    mlp = params["mlp"] if isinstance(params, dict) else row.get("mlp_params", dense_params)
    size = mlp_bytes(mlp, row.get("quantization"))
    if size is None:
        raise SystemExit(f"no MLP size for {label}: pass --dense-mlp-params")
    return size / 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dense")
    parser.add_argument("plot", type=Path)
    parser.add_argument("points", nargs="+", metavar="LABEL=FILE[@ROW]")
    parser.add_argument("--dense-mlp-params", type=int, default=None)
    args = parser.parse_args(argv)
    dense = _row(f"{args.dense}@0")
    names = [n for n in HELDOUT_SOURCES if n in dense["perplexity"]]
    names += sorted(n for n in dense["perplexity"] if n not in HELDOUT_SOURCES)
    points = [("dense bf16", dense)] + [
        (label, _row(spec)) for label, _, spec in (item.partition("=") for item in args.points)
    ]
    headers = ["point", "MLP MB", *(Path(n).stem for n in names), "geomean domains", "geomean all"]
    body, plotted = [], []
    for label, row in points:
        every = ratios_to_dense(dense["perplexity"], row["perplexity"])
        domains = ratios_to_dense(
            {n: dense["perplexity"][n] for n in names if n in HELDOUT_SOURCES}, row["perplexity"]
        )
        megabytes = _megabytes(label, row, args.dense_mlp_params)
        ratios = [f"×{every['ratios'][n]:.3f}" if n in every["ratios"] else "–" for n in names]
        overall = f"×{every['geomean']:.3f}" if len(every["ratios"]) == len(names) else "–"
        body.append([label, f"{megabytes:.1f}", *ratios, f"×{domains['geomean']:.3f}", overall])
        plotted.append((label, megabytes, domains["geomean"]))
    print(markdown_table(headers, body))
    plot_memory_quality(plotted, args.plot, f"memory against quality: {dense['model']}")


if __name__ == "__main__":
    main()
