"""``bench launches``: each launch of the fused MLP timed on its own, beside the launch model's prediction.

The first device run's diagnostic (issue 17): for every model and token count, the fused op is checked
once against a float64 evaluation of the PyTorch reference, then called over rotating weight copies
(no call finds its weights in L2) with a pair of device events around every launch it makes, each call
queued behind a spinning kernel so that the events time the device's work and not the host's gaps
(the first device run, without it, timed 2-13x the predictions on the host's pace); each
launch's median is set beside :func:`svdmlp.plan.launches.predict_launch` of the very launch that ran
(its real grid, tiles and operands). The whole call is timed too: the sum of the launches against it
shows the gaps between them; and the host's seconds to queue the call, what an eager caller pays
when its kernels are shorter. A first pass over every row reports the compile seconds. Each row is
handed to ``emit`` as soon as it exists, so that a run cut short keeps what it measured.

On a CPU (the dry run, under ``TRITON_INTERPRET=1``) the same plumbing runs with wall-clock timers.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from unittest import mock

import torch

from svdmlp.backends import torch_ref
from svdmlp.bench.environment import cache_bytes
from svdmlp.bench.workloads import compare, random_lowrank, weight_sets
from svdmlp.plan.hardware import Hardware
from svdmlp.plan.launches import predict_launch
from svdmlp.plan.planner import mlp_ranks
from svdmlp.plan.shapes import MLPShape
from svdmlp.timing import hold_stream

WARMUP = 3


@dataclass(frozen=True)
class LaunchBenchConfig:
    device: torch.device
    models: tuple[MLPShape, ...]
    tokens: tuple[int, ...]
    keep: float
    align: int
    dtype: torch.dtype
    repeats: int
    budget_s: float
    hardware: Hardware

    def to_dict(self) -> dict:
        return {
            "device": str(self.device),
            "models": [shape.to_dict() for shape in self.models],
            "tokens": list(self.tokens),
            "keep": self.keep,
            "align": self.align,
            "dtype": str(self.dtype).removeprefix("torch."),
            "repeats": self.repeats,
            "budget_s": self.budget_s,
            "hardware": self.hardware.name,
        }


class _Clock:
    """Marks on the device's timeline (CUDA events) or the host's (perf_counter on CPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def hold(self) -> None:
        """On CUDA, keep the device busy while the host queues the next call (see
        :func:`svdmlp.timing.hold_stream`): its events then time the kernels, not the host."""
        if self.cuda:
            hold_stream()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


@contextlib.contextmanager
def _timed_launches(clock: _Clock) -> Iterator[list[tuple]]:
    """Within this context every launch the kernels make is bracketed by two clock marks and
    recorded as ``(Launch, start, end)``."""
    from svdmlp.kernels import common
    from svdmlp.kernels.capture import KERNELS, Launch

    records: list[tuple] = []

    def timed_kernel(kernel):
        original = kernel.run

        def run(*args, grid, warmup=False, **kwargs):
            start = clock.mark()
            result = original(*args, grid=grid, warmup=warmup, **kwargs)
            records.append(
                (Launch(kernel, args, tuple(sorted(kwargs.items())), tuple(grid)), start, clock.mark())
            )
            return result

        return run

    original_library = common.library_matmul

    def timed_library(a, b, out):
        start = clock.mark()
        result = original_library(a, b, out)
        records.append((Launch(None, (a, b, out)), start, clock.mark()))
        return result

    with contextlib.ExitStack() as stack:
        for kernel in KERNELS:
            stack.enter_context(mock.patch.object(kernel, "run", timed_kernel(kernel)))
        stack.enter_context(mock.patch.object(common, "library_matmul", timed_library))
        yield records


def _call(op: Callable, x: torch.Tensor, weights) -> torch.Tensor:
    return op(x, *weights.factors, "silu")


def measure_row(config: LaunchBenchConfig, shape: MLPShape, m: int, op: Callable) -> dict:
    """One model at ``m`` tokens: the check, each launch's median time and prediction, the whole call."""
    ranks = mlp_ranks(shape, config.keep, config.align)
    device, dtype = config.device, config.dtype

    def make():
        return random_lowrank(shape.hidden, shape.intermediate, ranks.as_tuple(), dtype, device)

    cuda = device.type == "cuda"
    # Rotating copies keep L2 from serving the weights on a GPU; a dry run on a CPU needs one.
    sets = weight_sets(make, cache_bytes(device)) if cuda else [make()]
    x = torch.randn(m, shape.hidden, device=device, dtype=dtype)
    reference = torch_ref.lowrank_gated_mlp(x.double(), *(t.double() for t in sets[0].factors), "silu").to(
        dtype
    )
    check = compare(_call(op, x, sets[0]), reference)
    clock = _Clock(device)
    for _ in range(WARMUP if cuda else 1):
        for weights in sets:
            _call(op, x, weights)
    whole, host = [], []
    with _timed_launches(clock) as records:
        for _ in range(config.repeats):
            for weights in sets:
                clock.hold()
                started = time.perf_counter()
                start = clock.mark()
                _call(op, x, weights)
                whole.append((start, clock.mark()))
                host.append(time.perf_counter() - started)
    clock.sync()
    per_call = len(records) // (config.repeats * len(sets))
    launches = []
    for index in range(per_call):
        runs = records[index::per_call]
        launch = runs[0][0]
        predicted = predict_launch(config.hardware, launch)
        measured = statistics.median(clock.seconds(start, end) for _, start, end in runs)
        launches.append(
            {
                "kernel": predicted.kernel,
                "tiles": predicted.tiles,
                "programs": predicted.programs,
                "measured_s": measured,
                "predicted_s": predicted.seconds,
                "measured_over_predicted": measured / predicted.seconds,
                "prediction": predicted.to_dict(),
            }
        )
    return {
        "model": shape.name,
        "m": m,
        "keep": config.keep,
        "ranks": ranks.to_dict(),
        "check": check,
        "launches": launches,
        "whole_s": statistics.median(clock.seconds(start, end) for start, end in whole),
        "host_s": statistics.median(host),
        "launches_sum_s": sum(launch["measured_s"] for launch in launches),
        "predicted_sum_s": sum(launch["predicted_s"] for launch in launches),
    }


def compile_pass(config: LaunchBenchConfig, op: Callable) -> float:
    """Call every row once (Triton compiles each distinct launch here); the seconds it took."""
    start = time.perf_counter()
    for shape in config.models:
        ranks = mlp_ranks(shape, config.keep, config.align)
        weights = random_lowrank(
            shape.hidden, shape.intermediate, ranks.as_tuple(), config.dtype, config.device
        )
        for m in config.tokens:
            _call(op, torch.randn(m, shape.hidden, device=config.device, dtype=config.dtype), weights)
    _Clock(config.device).sync()
    return time.perf_counter() - start


def run(
    config: LaunchBenchConfig, op: Callable, emit: Callable[[dict], None], log: Callable[[str], None]
) -> dict:
    """The compile pass, then every row within the budget; each row is emitted as soon as it exists."""
    compile_s = compile_pass(config, op)
    log(
        f"compile pre-pass: {compile_s:.1f} s for {len(config.models)} models x {len(config.tokens)} token counts"
    )
    emit({"compile_s": compile_s})
    started, rows, skipped = time.perf_counter(), [], []
    for shape in config.models:
        for m in config.tokens:
            if time.perf_counter() - started > config.budget_s:
                skipped.append({"model": shape.name, "m": m})
                continue
            row = measure_row(config, shape, m, op)
            rows.append(row)
            emit(row)
            log(format_row(row))
    return {"config": config.to_dict(), "compile_s": compile_s, "rows": rows, "skipped": skipped}


def format_row(row: dict) -> str:
    ok = "ok" if row["check"]["ok"] else f"CHECK FAILED (rel {row['check']['rel_err']:.2e})"
    lines = [
        f"{row['model']} M={row['m']}: {ok}; whole call {row['whole_s'] * 1e6:.1f} µs, launches "
        f"{row['launches_sum_s'] * 1e6:.1f} µs measured / {row['predicted_sum_s'] * 1e6:.1f} µs predicted; "
        f"host {row['host_s'] * 1e6:.1f} µs to queue it"
    ]
    for launch in row["launches"]:
        lines.append(
            f"    {launch['kernel']:18s} {launch['tiles']:28s} {launch['measured_s'] * 1e6:9.1f} µs "
            f"(predicted {launch['predicted_s'] * 1e6:.1f}, x{launch['measured_over_predicted']:.2f})"
        )
    return "\n".join(lines)
