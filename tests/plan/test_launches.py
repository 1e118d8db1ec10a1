"""The launch model: its rules hold for every launch of the benchmark sweep, and its sums make sense."""

from __future__ import annotations

import pytest
import torch

from svdmlp.plan import launches
from svdmlp.plan.hardware import H200, TRN1
from svdmlp.plan.planner import mlp_ranks
from svdmlp.plan.shapes import BUILTIN, PAPER_MODELS

TOKENS = (1, 16, 128, 512, 2048, 8192)
SWEEP = [(shape, keep) for shape in PAPER_MODELS for keep in (0.8, 0.6)]


@pytest.fixture(scope="module")
def sweep():
    """Every row of the kernel benchmark's GPU sweep (bf16, align 128), predicted once."""
    return {
        (shape.name, keep, m): launches.predict_mlp(H200, shape, mlp_ranks(shape, keep, 128), m)
        for shape, keep in SWEEP
        for m in TOKENS
    }


def test_every_launch_of_the_sweep_keeps_the_rules(sweep):
    """At least a full wave of programs (or a stated reason), and at M <= 256 at least 32 KB of
    weights in flight per SM on every weight stream."""
    problems = [f"{key}: {p}" for key, row in sweep.items() for p in launches.rule_problems(H200, row)]
    assert problems == []


def test_the_rules_catch_a_starved_stream_and_a_small_grid():
    tiny = launches.LaunchPrediction(
        "matmul", "t", 8, 1, 1, (launches.Loop("K", 2048, 0, 3, 1, 4096, 0.0),), 1, 1, 0, 1.0, "memory", None
    )
    row = launches.MLPLaunches(1, (tiny,), {"fused": 1.0, "dense": 1.0, "unfused": 1.0}, 1.0)
    problems = launches.rule_problems(H200, row)
    assert len(problems) == 2
    assert "8 programs on 132 SMs" in problems[0] and "4 KB of weights in flight" in problems[1]


def test_decode_runs_three_triton_launches_and_prefill_hands_plain_gemms_to_the_library(sweep):
    decode = sweep[("llama-3.2-1b", 0.8, 1)]
    assert [launch.kernel for launch in decode.launches] == ["matmul", "gated_expand+down", "matmul"]
    prefill = sweep[("llama-3.2-1b", 0.8, 2048)]
    assert [launch.kernel for launch in prefill.launches] == ["cublas", "gated_expand", "cublas", "cublas"]


def test_no_prediction_beats_the_roofline(sweep):
    for key, row in sweep.items():
        assert row.seconds["fused"] >= row.floor_seconds, key
        for launch in row.launches:
            assert launch.seconds >= launch.hbm_bytes / H200.bandwidth, (key, launch.kernel)
            assert launch.seconds >= launch.flops / H200.peak_flops, (key, launch.kernel)


def test_decode_moves_the_factors_once():
    """At M = 1 the launches read each factor once: their bytes are the low-rank MLP's within 5%."""
    shape = BUILTIN["llama-3.1-8b"]
    ranks = mlp_ranks(shape, 0.8, 128)
    row = launches.predict_mlp(H200, shape, ranks, 1)
    factor_bytes = 2 * sum(ranks.as_tuple()) * (shape.hidden + shape.intermediate)
    assert sum(launch.hbm_bytes for launch in row.launches) == pytest.approx(factor_bytes, rel=0.05)


def test_fewer_bytes_in_flight_stream_slower():
    where = launches.occupancy(H200, programs=132, smem_per_program=1024, num_warps=4)
    starved = launches._loop(H200, where, "K", 1024, 0, 3, 1 << 30)
    fed = launches._loop(H200, where, "K", 32 * 1024, 0, 3, 1 << 30)
    assert starved.seconds > fed.seconds == pytest.approx((1 << 30) / H200.bandwidth)


def test_occupancy_counts_waves_and_residents():
    where = launches.occupancy(H200, programs=300, smem_per_program=100 * 1024, num_warps=4)
    assert (where.busy_sms, where.most_per_sm, where.least_resident, where.waves) == (132, 3, 2, 2)


def test_only_gpus_and_16_bit_dtypes_are_modelled():
    shape = BUILTIN["smollm2-135m"]
    ranks = mlp_ranks(shape, 0.8, 32)
    with pytest.raises(ValueError, match="GPUs"):
        launches.predict_mlp(TRN1, shape, ranks, 1)
    with pytest.raises(ValueError, match="16-bit"):
        launches.predict_mlp(H200, shape, ranks, 1, torch.float32)
