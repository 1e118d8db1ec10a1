"""``bench kernel``: the fused low-rank MLP against cuBLAS dense and the unfused PyTorch path, and at
decode sizes the fused MLP on the same factors stored int8 and int4 (``fused_int8``, ``fused_int4``).

Every row is one MLP shape at one token count ``M`` and one ``keep``: the providers' median times,
the measured ceilings, the floor ``max(bytes / bandwidth, FLOPs / peak)`` from each MLP's ideal
traffic (:func:`svdmlp.plan.cost.mlp_ideal`), % of floor and speedups. On a CPU the same sweep runs
the PyTorch paths on small shapes in float32; the Triton path needs a CUDA GPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from svdmlp.backends import torch_ref, triton_unavailable_reason
from svdmlp.bench.ceilings import Ceilings, measure_ceilings
from svdmlp.bench.environment import cache_bytes
from svdmlp.bench.workloads import (
    compare,
    dense_mlp,
    lowrank_provider,
    quantized_lowrank,
    random_dense,
    random_lowrank,
    rotating,
    weight_sets,
)
from svdmlp.cuda_graphs import capture_graph
from svdmlp.int_weights import SCHEMES
from svdmlp.plan.cost import floor_seconds, mlp_ideal
from svdmlp.plan.planner import MLPRanks, mlp_ranks
from svdmlp.plan.shapes import BUILTIN, PAPER_MODELS, SMALL_MODELS, MLPShape
from svdmlp.timing import cpu_median, cuda_median

# Timed work per provider and row: enough repeats that the median is stable, few enough that the
# whole GPU sweep (72 rows × 3 providers) fits in minutes. CUDA: 10–100 repeats; CPU: 3–25.
CUDA_TARGET_S, CUDA_REPEATS = 0.05, (10, 100)
CPU_TARGET_S, CPU_REPEATS = 0.05, (3, 25)
# Ceilings: a 1 GiB copy and an 8192³ matmul on the GPU (as the project's H200 baselines were
# measured, design.md §5); sizes a shared 2-core CPU measures in a second or two.
CUDA_CEILING_SIZES, CUDA_QUICK_CEILING_SIZES = (1 << 30, 8192), (1 << 28, 4096)
CPU_CEILING_SIZES, CPU_QUICK_CEILING_SIZES = (1 << 27, 1024), (1 << 25, 512)
PROVIDERS = ("fused", "fused_int8", "fused_int4", "dense", "unfused", "compiled")
# The fused variants on quantized factors, by the scheme of their factors; run at decode sizes only
# (svdmlp.kernels.configs.DECODE_MAX_TOKENS, not imported: it needs Triton).
QUANTIZED = {"fused_int8": "int8", "fused_int4": "int4"}
QUANTIZED_MAX_TOKENS = 16
# Checked against the PyTorch low-rank path (on the same factors, quantized or not) before timing.
CHECKED = ("fused", *QUANTIZED, "compiled")


@dataclass(frozen=True)
class KernelBenchConfig:
    """What to sweep. :func:`default_config` gives the GPU and CPU sweeps the project reports."""

    device: torch.device
    models: tuple[MLPShape, ...]
    tokens: tuple[int, ...]
    keeps: tuple[float, ...]
    dtype: torch.dtype
    align: int
    compile: bool
    quick: bool
    budget_s: float

    def to_dict(self) -> dict:
        return {
            "device": str(self.device),
            "models": [shape.to_dict() for shape in self.models],
            "tokens": list(self.tokens),
            "keeps": list(self.keeps),
            "dtype": str(self.dtype).removeprefix("torch."),
            "align": self.align,
            "graphs": self.device.type == "cuda",
            "compile": self.compile,
            "quick": self.quick,
            "budget_s": self.budget_s,
        }


def default_config(
    device: torch.device, quick: bool, compile: bool = False, budget_s: float = 420.0, align: int = 128
) -> KernelBenchConfig:
    """GPU: the six paper models × M ∈ {1 … 8192} × keep {0.8, 0.6} in bf16 (``quick``: one model,
    M ∈ {1, 128}, keep 0.8). CPU: three small models × M ∈ {1 … 512} in float32 (``quick``: one)."""
    if device.type == "cuda":
        models = (BUILTIN["llama-3.2-1b"],) if quick else PAPER_MODELS
        tokens = (1, 128) if quick else (1, 16, 128, 512, 2048, 8192)
        dtype = torch.bfloat16
    else:
        models = SMALL_MODELS[:1] if quick else SMALL_MODELS
        tokens = (1, 16) if quick else (1, 16, 128, 512)
        dtype = torch.float32
    keeps = (0.8,) if quick else (0.8, 0.6)
    return KernelBenchConfig(device, models, tokens, keeps, dtype, align, compile, quick, budget_s)


def fused_ops(device: torch.device) -> tuple[dict[str, Callable], str | None]:
    """The fused Triton ops by provider name (``lowrank_gated_mlp`` itself, not the backend's measured
    choice between it and the unfused chain, which is the faster of the two columns; the quantized
    variants'), or none and why they are not run here."""
    if device.type != "cuda":
        return {}, "the fused Triton path needs a CUDA GPU; on CPU only the PyTorch paths are compared"
    reason = triton_unavailable_reason(device)
    if reason is not None:
        return {}, reason
    try:
        from svdmlp import kernels
    except ImportError as err:
        return {}, f"the Triton kernels failed to import: {err}"
    return {"fused": kernels.lowrank_gated_mlp} | dict.fromkeys(QUANTIZED, kernels.quantized_gated_mlp), None


def _repeats(estimate_s: float, target_s: float, bounds: tuple[int, int]) -> int:
    low, high = bounds
    return max(low, min(high, round(target_s / max(estimate_s, 1e-9))))


def time_call(
    fn: Callable[[], None], device: torch.device, graph: bool, estimate_s: float
) -> tuple[float, str | None]:
    """Median seconds of ``fn``, and a note when graph capture failed and eager timing was used."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()  # warm-up, and a measure of how many repeats fit
        repeats = _repeats(time.perf_counter() - start, CPU_TARGET_S, CPU_REPEATS)
        return cpu_median(fn, repeats, warmup=0), None
    repeats = _repeats(estimate_s, CUDA_TARGET_S, CUDA_REPEATS)
    note = None
    if graph:
        try:
            return cuda_median(capture_graph(fn), repeats), None
        except Exception as err:  # capture can fail in many ways; eager timing is still a result
            note = f"graph capture failed, timed eagerly: {err}"
            torch.cuda.synchronize()
    return cuda_median(fn, repeats), note


@dataclass
class Workload:
    """One (model, keep): the weight sets every provider runs on, and the providers."""

    shape: MLPShape
    keep: float
    ranks: MLPRanks
    dense_sets: list
    lowrank_sets: list
    providers: dict[str, Callable]
    quantized_sets: dict[str, list]  # by scheme name, for the providers of QUANTIZED

    def sets(self, provider: str) -> list:
        """The weight sets ``provider`` runs on."""
        if provider == "dense":
            return self.dense_sets
        return self.quantized_sets[QUANTIZED[provider]] if provider in QUANTIZED else self.lowrank_sets


def _error(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


def measure_row(
    work: Workload,
    m: int,
    config: KernelBenchConfig,
    ceilings: Ceilings,
    dense_cache: dict[tuple[str, int], float],
) -> dict:
    """Check the low-rank providers against the PyTorch path, then time every provider at ``m``."""
    shape, device, s = work.shape, config.device, config.dtype.itemsize
    h, i, ranks = shape.hidden, shape.intermediate, work.ranks.as_tuple()
    x = torch.randn(m, h, device=device, dtype=config.dtype)
    ideal = {"dense": mlp_ideal(m, h, i, None, s), "lowrank": mlp_ideal(m, h, i, ranks, s)}
    for scheme, sets in work.quantized_sets.items():
        ideal[scheme] = mlp_ideal(m, h, i, ranks, s, weight_bytes=sets[0].nbytes)
    floors = {key: floor_seconds(t, ceilings.bandwidth, ceilings.matmul_flops) for key, t in ideal.items()}
    checks, errors, notes, times = {}, {}, {}, {}
    providers = {
        name: provider
        for name, provider in work.providers.items()
        if name not in QUANTIZED or m <= QUANTIZED_MAX_TOKENS
    }
    references = {}  # the unfused output on each first weight set, made once for every provider on it
    for name in CHECKED:
        if name in providers:
            first = work.sets(name)[0]
            try:
                if id(first) not in references:
                    references[id(first)] = work.providers["unfused"](x, first)
                checks[name] = compare(providers[name](x, first), references[id(first)])
            except Exception as err:  # one provider failing on one shape must not end the sweep
                errors[name] = _error(err)
                del providers[name]
    # Every row's calls are CUDA-graph replays: the kernels' device time. Eager, the host's launch
    # overhead set the time of whole rows (the first device run: the fused M = 512 rows ran at the
    # host's pace, 2-3x their kernels' sum); `bench launches` reports that host time on its own.
    graph = device.type == "cuda"
    for name, provider in providers.items():
        if name == "dense" and (shape.name, m) in dense_cache:
            times[name] = dense_cache[(shape.name, m)]
            continue
        sets = work.sets(name)
        floor = floors[_floor_key(name)]
        try:
            seconds, note = time_call(rotating(provider, x, sets), device, graph, floor * len(sets))
        except Exception as err:
            errors[name] = _error(err)
            continue
        times[name] = seconds / len(sets)
        if note:
            notes[name] = note
    if "dense" in times:
        dense_cache[(shape.name, m)] = times["dense"]
    return _row(work, m, config, ideal, floors, times, checks, errors, notes, graph)


def _floor_key(provider: str) -> str:
    """The floor a provider is measured against: dense, low-rank, or low-rank with quantized factors."""
    if provider == "dense":
        return "dense"
    return QUANTIZED.get(provider, "lowrank")


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None:
        return None
    return numerator / denominator


def _row(work, m, config, ideal, floors, times, checks, errors, notes, graph) -> dict:
    t = {name: times.get(name) for name in PROVIDERS}
    best_baseline = min((v for v in (t["dense"], t["unfused"]) if v is not None), default=None)
    pct = {
        name: (None if t[name] is None else 100 * floors[_floor_key(name)] / t[name]) for name in PROVIDERS
    }
    return {
        "model": work.shape.name,
        "hidden": work.shape.hidden,
        "intermediate": work.shape.intermediate,
        "m": m,
        "keep": work.keep,
        "ranks": {"gate": work.ranks.gate, "up": work.ranks.up, "down": work.ranks.down},
        "achieved_keep": work.ranks.keep["total"],
        "dtype": str(config.dtype).removeprefix("torch."),
        "align": config.align,
        "graph": graph,
        "weight_sets": {"dense": len(work.dense_sets), "lowrank": len(work.lowrank_sets)},
        "bytes": {key: traffic.hbm_bytes for key, traffic in ideal.items()},
        "flops": {key: traffic.flops for key, traffic in ideal.items()},
        "floor_s": floors,
        "time_s": t,
        "pct_of_floor": pct,
        "speedup": {
            "fused_vs_dense": _ratio(t["dense"], t["fused"]),
            "fused_vs_unfused": _ratio(t["unfused"], t["fused"]),
            "fused_vs_best_baseline": _ratio(best_baseline, t["fused"]),
            # The Triton backend runs the faster of fused and unfused for each shape (backends.choice).
            "backend_vs_dense": _ratio(t["dense"], _faster(t["fused"], t["unfused"])),
            "unfused_vs_dense": _ratio(t["dense"], t["unfused"]),
            "compiled_vs_dense": _ratio(t["dense"], t["compiled"]),
            **{f"{name}_vs_dense": _ratio(t["dense"], t[name]) for name in QUANTIZED},
            **{f"{name}_vs_fused": _ratio(t["fused"], t[name]) for name in QUANTIZED},
            "ideal": floors["dense"] / floors["lowrank"],
        },
        "check": checks,
        "errors": errors,
        "notes": notes,
    }


def _faster(a: float | None, b: float | None) -> float | None:
    present = [t for t in (a, b) if t is not None]
    return min(present) if present else None


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def summarize(rows: list[dict], keeps: tuple[float, ...]) -> dict:
    """Per keep: the numbers the project's acceptance criteria are stated in.

    Mean (min, max) speedup over dense of each low-rank provider; mean % of floor, overall and at
    decode (M ≤ 16); the worst row of the fused path against the better of dense and unfused; how
    many checked outputs failed their check or raised.
    """
    summary = {}
    for keep in keeps:
        chosen = [row for row in rows if row["keep"] == keep]
        decode = [row for row in chosen if row["m"] <= 16]
        per_keep = {"rows": len(chosen)}
        keys = ("fused_vs_dense", "backend_vs_dense", "unfused_vs_dense", "compiled_vs_dense", "ideal")
        for key in keys + tuple(f"{name}_vs_{base}" for name in QUANTIZED for base in ("dense", "fused")):
            values = [row["speedup"][key] for row in chosen if row["speedup"][key] is not None]
            per_keep[key] = (
                {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}
                if values
                else None
            )
        per_keep["pct_of_floor"] = {
            name: _mean([row["pct_of_floor"][name] for row in chosen]) for name in PROVIDERS
        }
        per_keep["decode_pct_of_floor"] = {
            name: _mean([row["pct_of_floor"][name] for row in decode]) for name in PROVIDERS
        }
        per_keep["decode_fused_vs_dense"] = _mean([row["speedup"]["fused_vs_dense"] for row in decode])
        fused_rows = [row for row in chosen if row["speedup"]["fused_vs_best_baseline"] is not None]
        if fused_rows:
            worst = min(fused_rows, key=lambda row: row["speedup"]["fused_vs_best_baseline"])
            per_keep["worst_vs_best_baseline"] = {
                "model": worst["model"],
                "m": worst["m"],
                "speedup": worst["speedup"]["fused_vs_best_baseline"],
            }
        per_keep["check_failures"] = sum(
            1
            for row in chosen
            for name in CHECKED
            if name in row["errors"] or (name in row["check"] and not row["check"][name]["ok"])
        )
        summary[f"{keep:g}"] = per_keep
    return summary


def make_workload(
    shape: MLPShape, keep: float, config: KernelBenchConfig, dense_sets: list, cache_bytes: int, ops
) -> Workload:
    ranks = mlp_ranks(shape, keep, config.align)
    h, i, dtype, device = shape.hidden, shape.intermediate, config.dtype, config.device
    make_lowrank = partial(random_lowrank, h, i, ranks.as_tuple(), dtype, device)
    lowrank_sets = weight_sets(make_lowrank, cache_bytes)
    quantized_sets = {
        scheme: weight_sets(lambda how=SCHEMES[scheme]: quantized_lowrank(make_lowrank(), how), cache_bytes)
        for name, scheme in QUANTIZED.items()
        if name in ops
    }
    providers = {"dense": dense_mlp, **{name: lowrank_provider(op) for name, op in ops.items()}}
    return Workload(shape, keep, ranks, dense_sets, lowrank_sets, providers, quantized_sets)


def run(config: KernelBenchConfig, log: Callable[[str], None]) -> dict:
    """Measure the ceilings, then every (model, keep, M) row, printing progress through ``log``.

    Rows not started before ``config.budget_s`` seconds are listed as skipped, not measured.
    """
    torch.manual_seed(0)
    device = config.device
    sizes = (
        (CUDA_QUICK_CEILING_SIZES if config.quick else CUDA_CEILING_SIZES)
        if device.type == "cuda"
        else (CPU_QUICK_CEILING_SIZES if config.quick else CPU_CEILING_SIZES)
    )
    ceilings = measure_ceilings(device, config.dtype, *sizes)
    log(
        f"ceilings ({ceilings.dtype}): copy {ceilings.bandwidth / 1e9:.0f} GB/s, "
        f"matmul {ceilings.matmul_flops / 1e9:.0f} GFLOP/s"
    )
    fused, reason = fused_ops(device)
    if reason:
        log(f"fused path skipped: {reason}")
    ops = {"unfused": torch_ref.lowrank_gated_mlp} | fused
    cache = cache_bytes(device)
    rows, skipped, dense_cache = [], [], {}
    total = len(config.models) * len(config.keeps) * len(config.tokens)
    start = time.perf_counter()
    for shape in config.models:
        if time.perf_counter() - start > config.budget_s:
            skipped += [{"model": shape.name, "keep": k, "m": m} for k in config.keeps for m in config.tokens]
            continue
        make_dense = partial(random_dense, shape.hidden, shape.intermediate, config.dtype, device)
        dense_sets = weight_sets(make_dense, cache)
        for keep in config.keeps:
            if config.compile:
                # Dynamo recompiles per shape and gives up after 8 shapes of one function (its cache
                # size limit), silently running eager: start afresh for each (model, keep).
                torch._dynamo.reset()
                ops["compiled"] = torch.compile(torch_ref.lowrank_gated_mlp, dynamic=False)
            work = make_workload(shape, keep, config, dense_sets, cache, ops)
            for m in config.tokens:
                elapsed = time.perf_counter() - start
                if elapsed > config.budget_s:
                    skipped.append({"model": shape.name, "keep": keep, "m": m})
                    continue
                row = measure_row(work, m, config, ceilings, dense_cache)
                rows.append(row)
                log(_progress(row, len(rows) + len(skipped), total, time.perf_counter() - start))
            del work
        del dense_sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if skipped:
        log(f"time budget of {config.budget_s:.0f} s spent: {len(skipped)} rows skipped")
    return {
        "config": config.to_dict(),
        "ceilings": ceilings.to_dict(),
        "fused_unavailable": reason,
        "rows": rows,
        "skipped": skipped,
        "summary": summarize(rows, config.keeps),
        "elapsed_s": time.perf_counter() - start,
    }


def _progress(row: dict, done: int, total: int, elapsed: float) -> str:
    times = " ".join(
        f"{name} {row['time_s'][name] * 1e6:.1f}us" for name in PROVIDERS if row["time_s"][name] is not None
    )
    failed = [name for name, check in row["check"].items() if not check["ok"]] + list(row["errors"])
    flag = f" [problems: {', '.join(failed)}]" if failed else ""
    return f"[{done}/{total} {elapsed:.0f}s] {row['model']} keep {row['keep']:g} M={row['m']}: {times}{flag}"
