"""How much each round of solving quantization and correction in turn lowers the correction's own
objective, the output error ``‖(W − Q − V·U)·Xᵀ‖ / ‖W·Xᵀ‖`` on the calibration inputs, on a model's real
MLP weights: what :data:`svdmlp.compression.correction.CORRECTION_ROUNDS` is chosen from.

    python benchmarks/correction_rounds.py [--model M] [--layers 0,10,20] [--scheme int4-asym] [--keep 0.05]
        [--rounds 0,1,2] [--align 16]

The chosen layers are calibrated on the dense model (the default calibration windows); each projection's
weight is rounded by GPTQ with a correction of the rank ``--keep`` gives (:func:`corrected`) at each
number of rounds, and without a correction, and the errors printed as a Markdown table with their means.
"""

from __future__ import annotations

import argparse
import statistics

from svdmlp import arch, models
from svdmlp.compression import sequential
from svdmlp.compression.calibration import config_windows
from svdmlp.compression.correction import corrected
from svdmlp.compression.quantized_dense import output_error
from svdmlp.config import CompressConfig
from svdmlp.int_weights import dequantize, gptq, scheme
from svdmlp.ranks import rank_for_keep
from svdmlp.tables import markdown_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--layers", default="0,10,20")
    parser.add_argument("--scheme", default="int4-asym")
    parser.add_argument("--keep", type=float, default=0.05)
    parser.add_argument("--rounds", default="0,1,2")
    parser.add_argument("--align", type=int, default=16)
    args = parser.parse_args()
    how, rounds = scheme(args.scheme), [int(r) for r in args.rounds.split(",")]
    model, tokenizer, _ = models.load_dense(args.model)
    spec = arch.of_model(model)
    config = CompressConfig.preset(inter=arch.dense_projection(model, spec, 0, "gate").out_features)
    windows = config_windows(tokenizer, config, None, bos=arch.bos_token_id(spec, tokenizer))
    indices = [int(i) for i in args.layers.split(",")]
    rows, errors = [], {r: [] for r in ["none", *rounds]}
    walk = sequential.calibrated_layers(model, spec, windows, indices, dense=True)
    for index, grams, _ in walk:
        for name in arch.PROJECTIONS:
            weight = arch.dense_projection(model, spec, index, name).weight.detach().float()
            gram = grams.input_gram(name)
            rank = rank_for_keep(weight.shape[1], weight.shape[0], args.keep, args.align)
            q, scales = gptq(weight, gram, how)
            row = {"none": output_error(weight, dequantize(q, scales, tuple(weight.shape)), gram)}
            for r in rounds:
                fixed = corrected(weight, gram, grams.whitening(name), how, rank, r)
                value = (
                    dequantize(fixed.q, fixed.scales, tuple(weight.shape))
                    + fixed.correction.v @ fixed.correction.u
                )
                row[r] = output_error(weight, value, gram)
            for key, value in row.items():
                errors[key].append(value)
            rows.append([f"{index} {name}", rank, *(f"{row[k]:.4f}" for k in errors)])
    rows.append(["mean", "", *(f"{statistics.fmean(v):.4f}" for v in errors.values())])
    header = ["matrix", "rank", "no correction", *(f"{r} rounds" for r in rounds)]
    print(f"{args.scheme}, correction keep {args.keep}, relative output error on the calibration inputs")
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
