#!/usr/bin/env bash
# One-shot GPU check for a short H200 lease: versions, the GPU-only kernel tests and the fuzz, then the kernel
# benchmark (the six paper models' MLPs x M in {1..8192} x keep {0.8, 0.6}, bf16, align 128).
#
#   OUT=/some/dir bash benchmarks/gpu_kernel.sh      # run from the repository root
#
# Everything lands under $OUT: env.txt, gpu_tests.txt, bench.txt, kernel.json, kernel.png.
# Sized for one 10-minute command: tests are cut at $TEST_TIMEOUT s (default 120), and benchmark
# rows not started within $BENCH_BUDGET s (default 360) are skipped and listed as such.
# The machine has no network: nothing is downloaded; svdmlp runs from this checkout.
set -uo pipefail

OUT=${OUT:-bench-out}
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
BENCH_BUDGET=${BENCH_BUDGET:-360}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

source "$(dirname "$0")/gpu_env.sh"
MARKS="gpu or fuzz"
BENCH_ARGS=()
if [ "$DRY" = 1 ]; then
    MARKS=gpu  # skipped on a CPU: the dry run checks the plumbing, the suite runs the fuzz
    BENCH_ARGS=(--quick --device cpu)
fi

echo "== GPU tests and the fuzz, natively: pytest -m '$MARKS' tests/kernels (cut at ${TEST_TIMEOUT}s)"
timeout "$TEST_TIMEOUT" "$PYTHON" -m pytest -m "$MARKS" tests/kernels -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt" | tail -n 30
echo "pytest exit status: ${PIPESTATUS[0]}"

echo "== bench kernel (row budget ${BENCH_BUDGET}s)"
"$PYTHON" -m svdmlp bench kernel "${BENCH_ARGS[@]}" --json "$OUT/kernel.json" --plot "$OUT/kernel.png" --budget-s "$BENCH_BUDGET" 2>&1 \
    | tee "$OUT/bench.txt"
status=${PIPESTATUS[0]}
echo "bench exit status: $status (1 = a fused output failed its correctness check)"
exit "$status"
