"""Markdown tables of compression candidates scored by ``svdmlp eval --json``: per candidate, the
geometric means of the held-out domains and of each unseen suite, and every text's ratio to dense.

    python benchmarks/candidates_table.py BASE.json NAME=FILE.json ...

BASE.json is an eval with the dense baseline (its first row is dense); each other file an eval of
one checkpoint on the same texts or some of them ("–" where a text was not scored; ``--no-baseline`` is
enough). The means are computed here from the
ratios the second table shows, by the function ``svdmlp eval`` uses.
"""

from __future__ import annotations

import json
import sys

from svdmlp.evaluate import suite
from svdmlp.tables import markdown_table

GROUPS = ("in-domain", "unseen (dev)", "unseen")  # "unseen" is the report suite


def main(base: str, candidates: list[str]) -> None:
    record = json.loads(open(base).read())
    dense = record["rows"][0]["perplexity"]
    rows = [("baseline", record["rows"][-1])]
    for item in candidates:
        name, _, path = item.partition("=")
        rows.append((name, json.loads(open(path).read())["rows"][-1]))
    summaries = [(name, row, suite.ratios_to_dense(dense, row["perplexity"])) for name, row in rows]
    means = []
    for name, row, summary in summaries:
        worst = max(summary["ratios"], key=summary["ratios"].get)
        groups = [summary["groups"].get(g, {}).get("geomean") for g in GROUPS]
        means.append(
            [name, f"{row.get('achieved_keep', 0):.4f}", *(f"×{g:.3f}" if g else "" for g in groups)]
            + [f"{worst} ×{summary['ratios'][worst]:.2f}"]
        )
    headers = ["candidate", "achieved keep", "in-domain", "unseen (dev)", "unseen (report)", "worst text"]
    print(markdown_table(headers, means))
    print()
    texts = list(summaries[0][2]["ratios"])
    body = [
        [
            t,
            f"{dense[t]:.3g}",
            *(f"×{s['ratios'][t]:.3f}" if t in s["ratios"] else "–" for _, _, s in summaries),
        ]
        for t in texts
    ]
    print(markdown_table(["text", "dense PPL", *(name for name, _, _ in summaries)], body))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
