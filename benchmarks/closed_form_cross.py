"""Closed-form healing's one statistic of the cross Gram, two ways, side by side in one run: the cross
Gram ``C = H̃ᵀH`` accumulated then ``W·Cᵀ`` (before session 19), against ``W·Cᵀ = (H·Wᵀ)ᵀ·H̃`` accumulated
directly (:func:`svdmlp.compression.heal.closed_form.down_grams`), on random activations at the MLP widths
of Qwen2.5-Coder-0.5B and -1.5B (BENCHMARKS.md, session 19).

    python benchmarks/closed_form_cross.py
"""

from __future__ import annotations

import time

import torch

from svdmlp.compression.gram import accumulate_product

WIDTHS = ((896, 4864), (1536, 8960))  # (hidden, inter)
BATCHES, ROWS = 4, 2052  # four batches of four 513-token windows


def _cross_gram_then_product(w: torch.Tensor, batches) -> torch.Tensor:
    cross = torch.zeros(w.shape[1], w.shape[1], dtype=torch.float64)
    for h, h_tilde in batches:
        accumulate_product(cross, h_tilde, h)
    return w.double() @ cross.T


def _outputs_against_compressed(w: torch.Tensor, batches) -> torch.Tensor:
    result = torch.zeros(w.shape, dtype=torch.float64)
    for h, h_tilde in batches:
        accumulate_product(result, h @ w.T, h_tilde)
    return result


def main() -> None:
    torch.manual_seed(0)
    for hidden, inter in WIDTHS:
        w = torch.randn(hidden, inter) * 0.02
        batches = [(torch.randn(ROWS, inter), torch.randn(ROWS, inter)) for _ in range(BATCHES)]
        best, results = {}, {}
        for way in (_cross_gram_then_product, _outputs_against_compressed) * 2:  # best of two, interleaved
            started = time.perf_counter()
            results[way.__name__] = way(w, batches)
            best[way.__name__] = min(best.get(way.__name__, float("inf")), time.perf_counter() - started)
        old, new = results.values()
        difference = float((new - old).abs().max() / old.abs().max())
        seconds = ", ".join(f"{name} {value:.2f} s" for name, value in best.items())
        ratio = best["_cross_gram_then_product"] / best["_outputs_against_compressed"]
        print(f"hidden {hidden}, inter {inter}: {seconds}; x{ratio:.2f}; largest difference {difference:.1e}")


if __name__ == "__main__":
    main()
