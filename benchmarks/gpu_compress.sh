#!/usr/bin/env bash
# Compression on CUDA, one decoder layer at a time (issue 18), on a short lease (about 4 minutes, 12 with
# WITH_8B=1): a random-weight Llama-3.2-1B-shaped checkpoint written on the device in bf16 and compressed
# with --device cuda at --layers 0,1 and 0,1,2,3 (the GPU's peak must not grow with the layers), then
# with WITH_8B=1 a Llama-3.1-8B-shaped one at --layers 0 (it must fit a 24 GB card). Each compression
# prints, and records in its JSON, the peak GPU memory torch's allocator held and the host's peak RSS.
#
#   OUT=/some/dir bash benchmarks/gpu_compress.sh      # run from the repository root
#
# Everything lands under $OUT as soon as it exists: env.txt, then NAME.txt and NAME.json for each
# compression (llama-1b-2, llama-1b-4, llama-8b-1). Calibration on the standard library's Python (the
# `python` source, on every machine) in 5 windows, closed-form healing, keep 0.8: the options of the
# CPU measurements in BENCHMARKS.md (sessions 13-18). STEP_TIMEOUT (default 240 s) cuts each compression.
set -uo pipefail

OUT=${OUT:-bench-out}
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

source "$(dirname "$0")/gpu_env.sh"
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
OPTIONS=(--keep 0.8 --calib python --calib-samples 5 --heal closed-form)
status=0

compress() {  # NAME MODEL_DIR LAYERS
    echo "== compress $2 --layers $3 on $DEVICE (cut at ${STEP_TIMEOUT}s)"
    timeout "$STEP_TIMEOUT" "$PYTHON" -m svdmlp compress "$2" "${OPTIONS[@]}" --layers "$3" --device "$DEVICE" \
        --out "$SCRATCH/$1" --json "$OUT/$1.json" > "$OUT/$1.txt" 2>&1
    local code=$?
    grep -E "^svdmlp: predicted|^peak memory|^compress wall time" "$OUT/$1.txt"
    echo "$1 exit status: $code (124 = cut by the timeout)"
    [ "$code" -eq 0 ] || status=$code
    rm -rf "${SCRATCH:?}/$1"
}

if [ "$DRY" = 1 ]; then  # the plumbing on a CPU: the tiny model given, two layers and one
    DEVICE=cpu
    OPTIONS=(--keep 0.8 --calib python --calib-samples 2 --calib-seq-len 32 --align 8 --heal closed-form)
    compress llama-1b-2 "$E2E_MODEL" 0,1
    compress llama-1b-4 "$E2E_MODEL" 0
    exit "$status"
fi

DEVICE=cuda
echo "== writing the random Llama-3.2-1B-shaped checkpoint"
"$PYTHON" "$(dirname "$0")/random_checkpoint.py" llama-3.2-1b "$SCRATCH/llama-1b" || exit 1
compress llama-1b-2 "$SCRATCH/llama-1b" 0,1
compress llama-1b-4 "$SCRATCH/llama-1b" 0,1,2,3
rm -rf "$SCRATCH/llama-1b"
if [ "${WITH_8B:-0}" = 1 ]; then
    echo "== writing the random Llama-3.1-8B-shaped checkpoint (16 GB)"
    "$PYTHON" "$(dirname "$0")/random_checkpoint.py" llama-3.1-8b "$SCRATCH/llama-8b" || exit 1
    compress llama-8b-1 "$SCRATCH/llama-8b" 0
fi
exit "$status"
