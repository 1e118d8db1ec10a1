"""A Markdown table of perplexity ratios to dense, from results scored separately under one protocol.

    python benchmarks/ratio_table.py DENSE.json LABEL=RESULT.json [LABEL=RESULT.json ...]

``DENSE.json`` is a sweep point (``OUT/points/dense.json``) or an ``svdmlp eval --json`` file whose
first row is the dense model; each ``RESULT.json`` is a sweep point or an ``svdmlp eval --json`` file
(its last row is taken, e.g. one scored with ``--no-baseline``). Every result must have scored the
same texts as the dense one; a text file is known by its name without folder and suffix, so the same
file scored from another folder matches. Columns: each text's ratio, the geometric mean over the built-in held-out
domains and over all texts, the achieved keep and the compression seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from svdmlp.corpora import HELDOUT_SOURCES
from svdmlp.evaluate.suite import ratios_to_dense
from svdmlp.tables import markdown_table


def read_row(path: str, first: bool = False) -> dict:
    """A sweep point, or one row of an ``svdmlp eval --json`` file: its first (the dense baseline) or
    last; its perplexities keyed by text name (a file's stem)."""
    data = json.loads(Path(path).read_text())
    row = data["rows"][0 if first else -1] if "rows" in data else data
    return {**row, "perplexity": {Path(n).stem: value for n, value in row["perplexity"].items()}}


def ratios_of(dense: dict[str, float], perplexity: dict[str, float]) -> dict:
    """``ratios`` (each text's, to dense) and their geometric means over the built-in held-out
    ``domains`` (None if none was scored) and over ``all`` texts."""
    every = ratios_to_dense(dense, perplexity)
    domains = ratios_to_dense({n: v for n, v in dense.items() if n in HELDOUT_SOURCES}, perplexity)
    return {"ratios": every["ratios"], "domains": domains["geomean"], "all": every["geomean"]}


def main(dense_path: str, results: list[str]) -> str:
    dense = read_row(dense_path, first=True)["perplexity"]
    names = [n for n in HELDOUT_SOURCES if n in dense] + [n for n in dense if n not in HELDOUT_SOURCES]
    headers = [
        "recipe",
        *names,
        "geomean domains",
        "geomean all",
        "keep",
        "compress s",
    ]
    rows = []
    for item in results:
        label, _, path = item.partition("=")
        row = read_row(path)
        if sorted(row["perplexity"]) != sorted(names):
            raise SystemExit(f"{path} scored other texts than {dense_path}")
        ratios = ratios_of(dense, row["perplexity"])
        cells = [label, *(f"×{ratios['ratios'][n]:.2f}" for n in names)]
        cells += [f"×{ratios['domains']:.3f}" if ratios["domains"] else "-", f"×{ratios['all']:.3f}"]
        seconds = row.get("compress_seconds")
        cells += [f"{row.get('achieved_keep', 1.0):.4f}", "-" if seconds is None else f"{seconds:.0f}"]
        rows.append(cells)
    return markdown_table(headers, rows)


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2:]))
