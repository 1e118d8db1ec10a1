# Sourced by the device scripts (expects OUT and PYTHON): writes what the run ran on to $OUT/env.txt
# (and the terminal), and sets DRY=1 for a dry run (DRY_RUN=1: the same steps on a CPU, the kernels
# under TRITON_INTERPRET=1, on tiny shapes; the tests run it to check the plumbing), else DRY=0.
if [ "${DRY_RUN:-0}" = 1 ]; then
    DRY=1
    export TRITON_INTERPRET=1
    echo "dry run on the CPU, $(date -u +%Y-%m-%dT%H:%M:%SZ)" | tee "$OUT/env.txt"
else
    DRY=0
    {
        date -u +%Y-%m-%dT%H:%M:%SZ
        git rev-parse HEAD 2>/dev/null || echo "not a git checkout"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
        "$PYTHON" - <<'PY'
import platform, torch, transformers, triton
print("python", platform.python_version(), "| torch", torch.__version__, "| triton", triton.__version__,
      "| transformers", transformers.__version__, "| cuda", torch.version.cuda)
props = torch.cuda.get_device_properties(0)
print(props.name, "| SMs", props.multi_processor_count, "| L2", getattr(props, "L2_cache_size", "?"),
      "| memory", props.total_memory)
PY
    } 2>&1 | tee "$OUT/env.txt"
fi
