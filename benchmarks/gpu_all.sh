#!/usr/bin/env bash
# Both GPU checks in one device command, for a lease of 15 minutes in all (a machine's start takes 1-2
# of them): gpu_kernel.sh then gpu_e2e.sh with budgets cut so the whole command ends inside about
# 9.5 minutes (tests 60 + 45 s, kernel rows started within 240 s, e2e cut at 180 s; each can be set,
# see below), leaving time for a short rerun of either.
#
#   OUT=/some/dir bash benchmarks/gpu_all.sh      # run from the repository root
#
# A device command returns at most 8 files, and the two scripts write 10, so each writes into its own
# scratch folder and everything is packed into $OUT/gpu-results.tar.gz; the two benchmark tables are
# also copied beside it (kernel-bench.txt, e2e.txt) so they can be read without unpacking.
set -uo pipefail

OUT=${OUT:-bench-out}
HERE=$(cd "$(dirname "$0")" && pwd)
SCRATCH=$(mktemp -d)
mkdir -p "$OUT"

OUT="$SCRATCH/kernel" TEST_TIMEOUT=${KERNEL_TEST_TIMEOUT:-60} BENCH_BUDGET=${KERNEL_BENCH_BUDGET:-200} \
    bash "$HERE/gpu_kernel.sh"
kernel_status=$?

OUT="$SCRATCH/e2e" TEST_TIMEOUT=${E2E_TEST_TIMEOUT:-45} BENCH_TIMEOUT=${E2E_BENCH_TIMEOUT:-150} \
    COMPILE_TIMEOUT=${E2E_COMPILE_TIMEOUT:-80} bash "$HERE/gpu_e2e.sh"
e2e_status=$?

tar -czf "$OUT/gpu-results.tar.gz" -C "$SCRATCH" kernel e2e
cp "$SCRATCH/kernel/bench.txt" "$OUT/kernel-bench.txt" 2>/dev/null
cp "$SCRATCH/e2e/e2e.txt" "$OUT/e2e.txt" 2>/dev/null
echo "kernel check exit status: $kernel_status; e2e check exit status: $e2e_status"
[ "$kernel_status" -eq 0 ] && [ "$e2e_status" -eq 0 ]
