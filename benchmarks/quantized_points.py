"""Dense MLPs rounded by GPTQ at any width, with and without a low-rank correction of the rounding error,
scored on the held-out domains and an unseen-text suite: the points of issue 50's bytes-quality front.

    python benchmarks/quantized_points.py OUT_DIR SPEC [SPEC ...] [--model M] [--suite dev|report] [--align A]

A SPEC is a sweep's baseline (:class:`svdmlp.quantize.Quantization`: ``int4``, ``int3-asym-gptq``,
``int3-asym-gptq+0.05``, ``int4-asym-gptq+0.05-int8``), optionally ``@ROUNDS`` for how many times quantization and correction are
solved in turn (default :data:`svdmlp.compression.correction.CORRECTION_ROUNDS`); a correction's rank is
a multiple of ``--align`` (default 32, as ``svdmlp compress``'s), the rank rule's or with ``--allocate``
each layer's from measured divergence (``OUT_DIR/SPEC-kl.json``). Each point is the dense model loaded
afresh, rounded as ``svdmlp eval --quantize S [--gptq] [--correction-keep K]`` rounds it (the default
calibration: 32 windows of 512 tokens of the five domains), and scored on 16 windows of 512 tokens per
text. The
dense model is scored once, into ``OUT_DIR/dense.json``; each point goes to ``OUT_DIR/SPEC.json`` (a
point already there is not run again), in ``svdmlp eval --json``'s form, so that
``benchmarks/candidates_table.py OUT_DIR/dense.json NAME=OUT_DIR/SPEC.json`` tabulates them too. Prints
each point's MLP megabytes (packed values, fp16 scales, the correction as stored) and geometric means.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from svdmlp import corpora, models, paths
from svdmlp.compression.correction import CORRECTION_ROUNDS
from svdmlp.compression.quantized_dense import quantize_dense_mlps
from svdmlp.compression.report import count_parameters, mlp_bytes
from svdmlp.config import CompressConfig
from svdmlp.evaluate import suite
from svdmlp.quantize import Quantization, quantize_mlp
from svdmlp.tables import markdown_table

SETTINGS = suite.EvalSettings(seq_len=512, max_windows=16)


def _scored(model_name: str, texts: list[str], spec: str | None, align: int, allocate: bool) -> dict:
    model, tokenizer, _ = models.load_dense(model_name)
    row = {"model": model_name, "kind": "dense", "params": count_parameters(model), "achieved_keep": 1.0}
    if spec is not None:
        baseline, _, rounds = spec.partition("@")
        how = Quantization.parse(baseline)
        rounds = int(rounds) if rounds else CORRECTION_ROUNDS
        started = time.perf_counter()
        if how.gptq:
            config = CompressConfig(align=align)
            row["quantization"] = quantize_dense_mlps(
                model,
                tokenizer,
                how.scheme,
                config,
                correction_keep=how.correction_keep,
                rounds=rounds,
                correction_bits=how.correction_bits,
                allocate=allocate,
            )
        else:
            row["quantization"] = quantize_mlp(model, how.scheme)
        row["kind"] = f"dense, MLP {spec}"
        row["compress_seconds"] = time.perf_counter() - started
    named = [(text, corpora.read_text(text, tokenizer)) for text in texts]
    return {**row, **suite.score(model, tokenizer, named, SETTINGS, spec or "dense")}


def _point(
    out: Path, name: str, model_name: str, texts: list[str], spec: str | None, align: int, allocate: bool
) -> dict:
    path = out / f"{name}{'-kl' * (allocate and spec is not None)}.json"
    if not path.is_file():
        record = {"rows": [_scored(model_name, texts, spec, align, allocate)]}
        paths.write_output(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return json.loads(path.read_text())["rows"][-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("specs", nargs="+", metavar="SPEC")
    parser.add_argument("--model", default=models.DEFAULT_MODEL)
    parser.add_argument("--suite", default="dev", choices=("dev", "report"))
    parser.add_argument("--align", type=int, default=32)
    parser.add_argument("--allocate", action="store_true", help="corrections' ranks from measured divergence")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    texts = list(corpora.HELDOUT_SOURCES) + corpora.expand([args.suite])
    dense = _point(args.out, "dense", args.model, texts, None, args.align, False)
    body = []
    for spec in ["dense", *args.specs]:
        row = (
            dense
            if spec == "dense"
            else _point(args.out, spec, args.model, texts, spec, args.align, args.allocate)
        )
        summary = suite.ratios_to_dense(dense["perplexity"], row["perplexity"])
        size = mlp_bytes(row["params"]["mlp"], row.get("quantization")) / 1e6
        means = [
            summary["groups"][group]["geomean"] for group in (corpora.IN_DOMAIN, corpora.group_of(texts[-1]))
        ]
        worst = max(summary["ratios"], key=summary["ratios"].get)
        body.append(
            [spec, f"{size:.1f}", *(f"×{m:.3f}" for m in means), f"{worst} ×{summary['ratios'][worst]:.2f}"]
        )
        print(
            markdown_table(["point", "MLP MB", "in-domain", args.suite, "worst text"], body[-1:]), flush=True
        )
    print()
    print(markdown_table(["point", "MLP MB", "in-domain", args.suite, "worst text"], body))


if __name__ == "__main__":
    main()
