#!/usr/bin/env bash
# The decode step on a short H200 lease (about 7 minutes): the compiled end-to-end bench at batch 1
# (dense, keep 0.8, keep 0.6; the backend's fused/unfused choices in its JSON), then where one decode
# step's time goes (benchmarks/decode_profile.py: every kernel of the step timed on the device), then the
# fused decode chain under PDL off, on, and on with an L2 prefetch of each dependent launch's weights
# (benchmarks/decode_tiles.py --chain), then the engine's GPU tests and the kernels' fuzz with whatever
# time is left.
#
#   OUT=/some/dir bash benchmarks/gpu_decode.sh      # run from the repository root
#
# Everything lands under $OUT as soon as it exists: env.txt, e2e-compiled.{txt,json},
# decode-profile.{txt,json}, chain.{txt,jsonl}, gpu_tests.txt. Cuts: E2E_TIMEOUT (default 200 s),
# PROFILE_TIMEOUT (150 s), CHAIN_TIMEOUT (120 s), TEST_TIMEOUT (90 s). COMPILE_MODE (default: default) is the engine's compile mode for both the bench
# and the profile: max-autotune times inductor's matmul kernels against cuBLAS (give it E2E_TIMEOUT=330).
set -uo pipefail

OUT=${OUT:-bench-out}
E2E_TIMEOUT=${E2E_TIMEOUT:-200}
PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-150}
CHAIN_TIMEOUT=${CHAIN_TIMEOUT:-120}
TEST_TIMEOUT=${TEST_TIMEOUT:-90}
COMPILE_MODE=${COMPILE_MODE:-default}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

source "$(dirname "$0")/gpu_env.sh"
E2E_ARGS=(--batch 1 --keep 0.8,0.6)
PROFILE_ARGS=(--compile-mode "$COMPILE_MODE")
CHAIN_ARGS=()
MARKS="gpu or fuzz"
if [ "$DRY" = 1 ]; then
    E2E_ARGS=(${E2E_MODEL:-} --keep 0.8 --batch 1 --prompt-len 8 --new-tokens 2 --repeats 1 --device cpu)
    PROFILE_ARGS=(--dry-run --compile-mode "$COMPILE_MODE")
    CHAIN_ARGS=(--dry-run)
    MARKS=gpu  # skipped on a CPU: the dry run checks the plumbing
fi

echo "== bench e2e, decode step compiled ($COMPILE_MODE), batch 1, no HF baseline (cut at ${E2E_TIMEOUT}s)"
timeout "$E2E_TIMEOUT" "$PYTHON" -m svdmlp bench e2e "${E2E_ARGS[@]}" --no-hf --compile-mode "$COMPILE_MODE" \
    --json "$OUT/e2e-compiled.json" 2>&1 | tee "$OUT/e2e-compiled.txt"
status=${PIPESTATUS[0]}
echo "compiled bench exit status: $status (124 = cut by the timeout)"

echo "== decode step profile, dense and keep 0.8 (cut at ${PROFILE_TIMEOUT}s)"
timeout "$PROFILE_TIMEOUT" "$PYTHON" "$(dirname "$0")/decode_profile.py" "${PROFILE_ARGS[@]}" --keep 0.8 --out "$OUT" 2>&1 \
    | grep -v "^USDT\|profiler_st" | tail -n 80
echo "profile exit status: ${PIPESTATUS[0]} (124 = cut by the timeout)"

echo "== the fused decode chain: PDL off, on, on with L2 prefetch (cut at ${CHAIN_TIMEOUT}s)"
timeout "$CHAIN_TIMEOUT" "$PYTHON" "$(dirname "$0")/decode_tiles.py" --chain "${CHAIN_ARGS[@]}" \
    --jsonl "$OUT/chain.jsonl" 2>&1 | tee "$OUT/chain.txt" | tail -n 8
echo "chain exit status: ${PIPESTATUS[0]} (124 = cut by the timeout)"

echo "== GPU tests: pytest -m '$MARKS' tests/engine tests/kernels (cut at ${TEST_TIMEOUT}s)"
timeout "$TEST_TIMEOUT" "$PYTHON" -m pytest -m "$MARKS" tests/engine tests/kernels -q -p no:cacheprovider 2>&1 \
    | tee "$OUT/gpu_tests.txt" | tail -n 20
echo "pytest exit status: ${PIPESTATUS[0]}"
exit "$status"
