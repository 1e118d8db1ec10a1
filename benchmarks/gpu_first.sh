#!/usr/bin/env bash
# The first, diagnostic device run (issue 17), at most about 5 minutes on an H200: versions, then
# `svdmlp bench launches` (bf16, keep 0.8, the six paper models at M = 1, 16, 128, 512, 2048: a compile
# pre-pass that reports its seconds, one check per row against float64, each launch timed with device
# events beside the launch model's prediction of it), then end to end at batch 1 without the Hugging
# Face baseline. Every row is appended to $OUT/launches.jsonl as soon as it is measured, so a timeout
# loses nothing. Joules per token come from NVML; PRICE=USD (per GPU-hour) adds dollars per million
# tokens. Then run the full sweep: benchmarks/gpu_all.sh.
#
#   OUT=/some/dir bash benchmarks/gpu_first.sh      # run from the repository root
#
# DRY_RUN=1 runs the same steps on a CPU (the kernels under TRITON_INTERPRET=1, a tiny MLP shape, end
# to end on $E2E_MODEL or the built-in SmolLM2) to check the plumbing; the tests do that.
set -uo pipefail

OUT=${OUT:-bench-out}
PYTHON=${PYTHON:-python3}
LAUNCH_BUDGET=${LAUNCH_BUDGET:-150}
E2E_TIMEOUT=${E2E_TIMEOUT:-100}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

source "$(dirname "$0")/gpu_env.sh"
if [ "$DRY" = 1 ]; then
    TINY=$(mktemp -d)
    echo '{"hidden_size": 96, "intermediate_size": 200, "num_hidden_layers": 1, "model_type": "llama"}' > "$TINY/config.json"
    LAUNCH_ARGS=(--models "$TINY" --tokens 1,40 --align 16 --repeats 1 --device cpu)
    E2E_ARGS=(${E2E_MODEL:+"$E2E_MODEL"} --batch 1 --prompt-len 8 --new-tokens 2 --repeats 1 --device cpu)
else
    LAUNCH_ARGS=(--tokens 1,16,128,512,2048)
    E2E_ARGS=(--batch 1)
fi

echo "== bench launches (rows started within ${LAUNCH_BUDGET}s)"
"$PYTHON" -m svdmlp bench launches "${LAUNCH_ARGS[@]}" --keep 0.8 --budget-s "$LAUNCH_BUDGET" \
    --jsonl "$OUT/launches.jsonl" --json "$OUT/launches.json" 2>&1 | tee "$OUT/launches.txt"
launch_status=${PIPESTATUS[0]}

echo "== bench e2e at batch 1, keep 0.8, no Hugging Face baseline (cut at ${E2E_TIMEOUT}s)"
timeout "$E2E_TIMEOUT" "$PYTHON" -m svdmlp bench e2e "${E2E_ARGS[@]}" --keep 0.8 --no-hf ${PRICE:+--price "$PRICE"} \
    --json "$OUT/e2e.json" 2>&1 \
    | tee "$OUT/e2e.txt"
e2e_status=${PIPESTATUS[0]}

echo "launches exit status: $launch_status (1 = a check failed); e2e exit status: $e2e_status (124 = cut)"
[ "$launch_status" -eq 0 ] && [ "$e2e_status" -eq 0 ]
