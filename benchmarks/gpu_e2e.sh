#!/usr/bin/env bash
# One-shot GPU check of end-to-end generation for a short H200 lease: versions, the GPU-only engine
# tests (graph replays equal eager decoding), then the e2e benchmark: a Llama-3.2-1B-shaped model
# with random bf16 weights (plus MODEL if given), dense vs keep {0.8, 0.6}, batch {1, 16},
# 128-token prompts, 128 new tokens, prefill tokens/s and decode ms/step against the
# weight-streaming floor, joules per token (NVML), and Hugging Face generate at batch 1 as the baseline;
# PRICE=USD (per GPU-hour) adds dollars per million tokens.
#
#   OUT=/some/dir bash benchmarks/gpu_e2e.sh [MODEL]      # run from the repository root
#
# Then the same at batch 1 with each engine's decode step compiled (torch.compile before the graph
# capture), cut at $COMPILE_TIMEOUT s (default 150); then keep 0.8 at batch 1 with its factors in bf16,
# int8 and int4 (svdmlp's Triton kernel reads the packed factors) beside the dense MLP weight-only int8, int4
# and int4 with a keep-0.05 correction (the anchor users compare with), cut at $QUANT_TIMEOUT s (default 120).
# Everything lands under $OUT: env.txt, gpu_tests.txt, e2e.txt, e2e.json, e2e.png, e2e-compiled.{txt,json},
# e2e-quantized.{txt,json}.
# Sized for one 8-minute command: tests are cut at $TEST_TIMEOUT s (default 90), the benchmark at
# $BENCH_TIMEOUT s (default 330; it takes about 2-3 minutes on an H200 without MODEL).
# The machine has no network: nothing is downloaded; svdmlp runs from this checkout.
set -uo pipefail

OUT=${OUT:-bench-out}
TEST_TIMEOUT=${TEST_TIMEOUT:-90}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-330}
COMPILE_TIMEOUT=${COMPILE_TIMEOUT:-150}
QUANT_TIMEOUT=${QUANT_TIMEOUT:-120}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

source "$(dirname "$0")/gpu_env.sh"
MODEL=${1:-}
RUN_ARGS=()
if [ "$DRY" = 1 ]; then
    MODEL=${E2E_MODEL:-$MODEL}
    RUN_ARGS=(--keep 0.8 --batch 1 --prompt-len 8 --new-tokens 2 --repeats 1 --device cpu)
fi

echo "== GPU tests: pytest -m gpu tests/engine (cut at ${TEST_TIMEOUT}s)"
timeout "$TEST_TIMEOUT" "$PYTHON" -m pytest -m gpu tests/engine -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt" | tail -n 30
echo "pytest exit status: ${PIPESTATUS[0]}"

echo "== bench e2e (cut at ${BENCH_TIMEOUT}s)"
timeout "$BENCH_TIMEOUT" "$PYTHON" -m svdmlp bench e2e ${MODEL:+"$MODEL"} "${RUN_ARGS[@]}" ${PRICE:+--price "$PRICE"} --json "$OUT/e2e.json" \
    --plot "$OUT/e2e.png" 2>&1 \
    | tee "$OUT/e2e.txt"
status=${PIPESTATUS[0]}
echo "bench exit status: $status (124 = cut by the timeout)"

echo "== bench e2e with the decode step compiled, batch 1, no HF baseline (cut at ${COMPILE_TIMEOUT}s)"
timeout "$COMPILE_TIMEOUT" "$PYTHON" -m svdmlp bench e2e ${MODEL:+"$MODEL"} "${RUN_ARGS[@]}" --batch 1 --no-hf --compile \
    --json "$OUT/e2e-compiled.json" 2>&1 | tee "$OUT/e2e-compiled.txt"
echo "compiled bench exit status: ${PIPESTATUS[0]} (124 = cut by the timeout)"

echo "== bench e2e with the factors in bf16, int8 and int4, keep 0.8, and the dense MLP weight-only int8, int4 and int4"
echo "   with a keep-0.05 correction (the anchor users compare with), batch 1, no HF baseline (cut at ${QUANT_TIMEOUT}s)"
timeout "$QUANT_TIMEOUT" "$PYTHON" -m svdmlp bench e2e ${MODEL:+"$MODEL"} "${RUN_ARGS[@]}" --keep 0.8 --batch 1 --no-hf \
    --factor-bits 16,8,4 --quantize int8,int4,int4-asym,int4+0.05,int4-asym+0.05-int8 --json "$OUT/e2e-quantized.json" 2>&1 | tee "$OUT/e2e-quantized.txt"
echo "quantized bench exit status: ${PIPESTATUS[0]} (124 = cut by the timeout)"
exit "$status"
