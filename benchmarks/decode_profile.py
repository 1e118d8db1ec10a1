"""Where one decode step's time goes: every kernel the engine's step runs, timed on the device.

The engine's compiled, graph-replayed decode step on the Llama-3.2-1B shape takes 1.5 ms/token on an
H200 against a 0.58 ms weight-streaming floor, and the MLP kernels are only part of it. This profiles
``--steps`` decode steps (torch.profiler, CUDA activity: device-side kernel times, also inside graph
replays) of the dense model and of each ``--keep``, and reports per step: the wall time, the sum of
the kernels' device times (their difference is the gaps between kernels; negative where launches
overlap: a programmatic dependent launch starts early and waits inside, so its time includes the
wait), the kernel count, and the
time by kind (GEMM/GEMV, svdmlp's Triton kernels, inductor's fused kernels, attention, copies), with
the costliest kernels by name. Results go to ``--out``/decode-profile.{txt,json} as each variant ends.

    python benchmarks/decode_profile.py --keep 0.8 --out DIR            # on CUDA
    python benchmarks/decode_profile.py --dry-run --out DIR             # tiny model on CPU (a test)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from svdmlp.bench import e2e
from svdmlp.engine import Engine

PROMPT_LEN = 128
# Kernel kinds, first match wins, by substrings of the kernel's name (lower case); svdmlp's Triton
# kernels are named `_..._kernel`, inductor's `triton_...`.
KINDS = (
    ("inductor triton", ("triton_",)),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("gemm/gemv", ("gemm", "gemv", "cublas", "cutlass", "xmma", "splitk", "sm90")),
    ("copy/fill", ("copy", "memcpy", "memset", "fill", "cat")),
)
DRY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=256,
)


def kind_of(name: str) -> str:
    lower = name.lower()
    if lower.startswith("_") and lower.endswith("_kernel"):
        return "svdmlp triton"
    for kind, needles in KINDS:
        if any(needle in lower for needle in needles):
            return kind
    return "other"


def kernel_events(prof) -> list:
    """Device-side kernel events (their duration is the device's, not the host's)."""
    events = []
    for event in prof.events():
        device_type = getattr(event, "device_type", None)
        if device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            events.append(event)
    return events


def profile_variant(model, name: str, steps: int, compile_mode: str | None, device: torch.device) -> dict:
    engine = Engine(
        model,
        max_batch=1,
        max_seq_len=PROMPT_LEN + steps + 1,
        compile=compile_mode is not None,
        compile_mode=compile_mode or "default",
        sync_every=steps + 1,
    )
    prompt = [[(7 * i) % model.config.vocab_size for i in range(PROMPT_LEN)]]
    started = time.perf_counter()
    engine.generate(prompt, steps + 1)  # compiles and captures the step
    warm_s = time.perf_counter() - started
    walls = [engine.generate(prompt, steps + 1).decode_s_per_step for _ in range(3)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        result = engine.generate(prompt, steps + 1)
    events = kernel_events(prof)
    by_name: dict[str, list[float]] = defaultdict(list)
    for event in events:
        by_name[event.name].append(event.device_time / 1e3)  # µs -> ms
    per_step = max(result.decode_steps, 1)
    # The profiled call includes the prefill: keep the kernels that ran a multiple of `steps` times
    # (the decode step's) apart from the rest, which the prefill ran.
    decode = {n: t for n, t in by_name.items() if len(t) >= result.decode_steps}
    kinds: dict[str, float] = defaultdict(float)
    for kernel, times in decode.items():
        kinds[kind_of(kernel)] += sum(times) / per_step
    kernel_ms = sum(kinds.values())
    top = sorted(decode.items(), key=lambda item: -sum(item[1]))[:25]
    return {
        "variant": name,
        "graph": result.graph,
        "compiled": result.compiled,
        "note": result.note,
        "warm_s": warm_s,
        "wall_ms_per_step": statistics.median(walls) * 1e3,
        "profiled_wall_ms_per_step": result.decode_s_per_step * 1e3,
        "kernel_ms_per_step": kernel_ms,
        "kernels_per_step": sum(len(t) for t in decode.values()) / per_step,
        "by_kind_ms": dict(sorted(kinds.items(), key=lambda item: -item[1])),
        "top": [
            {
                "name": n[:120],
                "kind": kind_of(n),
                "calls_per_step": len(t) / per_step,
                "ms_per_step": sum(t) / per_step,
                "us_each": 1e3 * statistics.median(t),
            }
            for n, t in top
        ],
    }


def report(row: dict) -> str:
    lines = [
        f"{row['variant']}: wall {row['wall_ms_per_step']:.3f} ms/step (profiled "
        f"{row['profiled_wall_ms_per_step']:.3f}); kernels {row['kernel_ms_per_step']:.3f} ms/step in "
        f"{row['kernels_per_step']:.0f} kernels; wall - kernels {row['wall_ms_per_step'] - row['kernel_ms_per_step']:.3f} ms"
        f" (graph {row['graph']}, compiled {row['compiled']}, warm-up {row['warm_s']:.1f} s)",
        "  by kind: " + ", ".join(f"{k} {v:.3f}" for k, v in row["by_kind_ms"].items()),
    ]
    for item in row["top"]:
        lines.append(
            f"  {item['ms_per_step']:7.4f} ms  {item['calls_per_step']:5.1f}x  {item['us_each']:7.2f} us  "
            f"{item['kind']:15s} {item['name']}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", default="0.8", help="comma-separated keeps besides dense ('' for none)")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--no-compile", action="store_true", help="profile the uncompiled step too")
    parser.add_argument(
        "--compile-mode", default="default", help="the engine's compile mode (default, max-autotune)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny random model on the CPU")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    keeps = [None] + [float(k) for k in args.keep.split(",") if k]
    rows = []
    for keep in keeps:
        for compile_mode in [args.compile_mode, None] if args.no_compile else [args.compile_mode]:
            if args.dry_run:
                from transformers import AutoModelForCausalLM, LlamaConfig

                torch.manual_seed(0)
                model = AutoModelForCausalLM.from_config(LlamaConfig(**DRY_CONFIG), dtype=dtype).eval()
            else:
                model = e2e.build_model(e2e.RANDOM_MODEL, device, dtype)
            name = "dense" if keep is None else f"keep {keep:g}"
            if keep is not None:
                e2e.install_random_lowrank(model, keep, 32 if args.dry_run else 128, "auto")
            name += f" ({compile_mode})" if compile_mode else " (not compiled)"
            rows.append(profile_variant(model, name, 2 if args.dry_run else args.steps, compile_mode, device))
            text = "\n\n".join(report(r) for r in rows)
            print(report(rows[-1]), flush=True)
            (args.out / "decode-profile.txt").write_text(text + "\n")
            (args.out / "decode-profile.json").write_text(json.dumps(rows, indent=1))
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
