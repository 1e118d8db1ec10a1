"""The benchmark's pieces on CPU: error checks, weight rotation, one row with a failing provider, summary."""

from functools import partial

import pytest
import torch

from svdmlp.backends import torch_ref
from svdmlp.bench.ceilings import Ceilings
from svdmlp.bench.kernel import (
    PROVIDERS,
    QUANTIZED,
    KernelBenchConfig,
    make_workload,
    measure_row,
    summarize,
)
from svdmlp.bench.workloads import compare, random_dense, weight_sets
from svdmlp.int_weights import QuantizedMatrix
from svdmlp.plan.shapes import MLPShape

TINY = MLPShape("tiny", 32, 64, 1, "llama")


def cpu_config() -> KernelBenchConfig:
    return KernelBenchConfig(
        device=torch.device("cpu"),
        models=(TINY,),
        tokens=(3,),
        keeps=(0.8,),
        dtype=torch.float32,
        align=16,
        compile=False,
        quick=True,
        budget_s=60.0,
    )


def test_compare_flags_wrong_and_non_finite_outputs():
    ref = torch.randn(4, 8)
    assert compare(ref.clone(), ref)["ok"]
    assert compare(ref.clone(), ref)["rel_err"] == 0
    assert not compare(ref * 1.1, ref)["ok"]
    broken = ref.clone()
    broken[0, 0] = float("nan")
    assert not compare(broken, ref)["ok"]
    # bf16 outputs get the looser tolerance: one bf16 rounding (2^-8) passes.
    assert compare(ref.bfloat16(), ref.bfloat16())["tolerance"] > compare(ref, ref)["tolerance"]


class Blob:
    def __init__(self, nbytes):
        self.nbytes = nbytes


def test_weight_sets_span_three_caches_at_most_eight_copies():
    assert len(weight_sets(lambda: Blob(100), cache_bytes=0)) == 1
    assert len(weight_sets(lambda: Blob(100), cache_bytes=100)) == 3
    assert len(weight_sets(lambda: Blob(1), cache_bytes=100)) == 8


def test_a_failing_provider_is_recorded_not_fatal():
    def broken(*args):
        raise RuntimeError("kernel exploded")

    def wrong(x, *factors):
        return torch_ref.lowrank_gated_mlp(x, *factors) * 2

    config = cpu_config()
    ops = {"unfused": torch_ref.lowrank_gated_mlp, "fused": broken, "compiled": wrong}
    dense_sets = weight_sets(
        partial(random_dense, TINY.hidden, TINY.intermediate, torch.float32, config.device), 0
    )
    work = make_workload(TINY, 0.8, config, dense_sets, 0, ops)
    row = measure_row(work, 3, config, Ceilings(1e10, 1e12, 0, 0, "float32"), {})
    assert "kernel exploded" in row["errors"]["fused"]
    assert row["time_s"]["fused"] is None and row["time_s"]["dense"] > 0 and row["time_s"]["unfused"] > 0
    assert not row["check"]["compiled"]["ok"] and row["time_s"]["compiled"] > 0
    assert row["ranks"] == {"gate": 16, "up": 16, "down": 16}
    assert row["speedup"]["ideal"] == pytest.approx(row["floor_s"]["dense"] / row["floor_s"]["lowrank"])
    summary = summarize([row], (0.8,))["0.8"]
    assert summary["check_failures"] == 2 and summary["fused_vs_dense"] is None


def test_the_quantized_variants_run_at_decode_on_their_own_factors():
    """Stand-ins for the quantized fused op (the unfused chain on the same quantized factors)."""
    config = cpu_config()
    ops = {"unfused": torch_ref.lowrank_gated_mlp} | dict.fromkeys(QUANTIZED, torch_ref.lowrank_gated_mlp)
    dense_sets = weight_sets(
        partial(random_dense, TINY.hidden, TINY.intermediate, torch.float32, config.device), 0
    )
    work = make_workload(TINY, 0.8, config, dense_sets, 0, ops)
    assert isinstance(work.sets("fused_int4")[0].gate_v_t, QuantizedMatrix)
    ceilings = Ceilings(1e10, 1e12, 0, 0, "float32")
    decode, above = (measure_row(work, m, config, ceilings, {}) for m in (3, 17))
    for name in QUANTIZED:
        assert decode["check"][name]["ok"] and decode["time_s"][name] > 0
        assert decode["speedup"][f"{name}_vs_fused"] is None  # no fused float path on CPU
        assert above["time_s"][name] is None and name not in above["check"]
    assert decode["bytes"]["int4"] < decode["bytes"]["int8"] < decode["bytes"]["lowrank"]
    summary = summarize([decode, above], (0.8,))["0.8"]
    assert summary["fused_int8_vs_dense"]["n"] == 1 and summary["check_failures"] == 0


def _row(model, m, dense, unfused, fused, floor=1.0):
    times = dict.fromkeys(PROVIDERS) | {"dense": dense, "unfused": unfused, "fused": fused}
    pct = {name: None if t is None else 100 * floor / t for name, t in times.items()}
    return {
        "model": model,
        "m": m,
        "keep": 0.8,
        "time_s": times,
        "pct_of_floor": pct,
        "speedup": {
            "fused_vs_dense": dense / fused,
            "unfused_vs_dense": dense / unfused,
            "fused_vs_best_baseline": min(dense, unfused) / fused,
            "backend_vs_dense": dense / min(fused, unfused),
            "compiled_vs_dense": None,
            **{f"{name}_vs_{base}": None for name in QUANTIZED for base in ("dense", "fused")},
            "ideal": 1.25,
        },
        "check": {"fused": {"ok": True}},
        "errors": {},
    }


def test_summary_means_decode_floor_and_worst_row():
    rows = [_row("a", 1, 2.0, 1.0, 1.0), _row("a", 512, 1.0, 1.0, 2.0), _row("b", 16, 4.0, 2.0, 2.0)]
    s = summarize(rows, (0.8,))["0.8"]
    assert s["fused_vs_dense"]["mean"] == pytest.approx((2.0 + 0.5 + 2.0) / 3)
    assert s["fused_vs_dense"]["min"] == 0.5
    assert s["backend_vs_dense"]["min"] == 1.0  # the backend runs the unfused chain where it is faster
    assert s["decode_fused_vs_dense"] == pytest.approx(2.0)
    assert s["decode_pct_of_floor"]["fused"] == pytest.approx((100 + 50) / 2)
    assert s["worst_vs_best_baseline"] == {"model": "a", "m": 512, "speedup": 0.5}
    assert s["check_failures"] == 0
