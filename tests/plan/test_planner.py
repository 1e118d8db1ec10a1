"""Whole-MLP plans against the project's measured anchors and the roofline's own invariants."""

import pytest

from svdmlp.plan.hardware import H200, HARDWARE
from svdmlp.plan.planner import mlp_ranks, plan_model
from svdmlp.plan.shapes import BUILTIN, PAPER_MODELS


@pytest.mark.parametrize(
    ("model", "rank"),
    # paper.md §3.3: block-aligned ranks at keep 0.8 (the paper code's 0.8 "compress ratio").
    [("llama-3.2-1b", 1280), ("llama-3.2-3b", 1792), ("llama-3.1-8b", 2560), ("qwen3-8b", 2432)],
)
def test_ranks_match_the_paper_table(model, rank):
    ranks = mlp_ranks(BUILTIN[model], 0.8, 128)
    assert (ranks.gate, ranks.up, ranks.down) == (rank, rank, rank)


def test_floors_match_the_h200_measurements_in_design_md():
    # design.md §5: Llama-3.2-1B MLP at M=1, floor 23.7 µs dense and 14.8 µs low-rank at keep 0.6.
    dense_row = plan_model(H200, BUILTIN["llama-3.2-1b"], 0.6, 128, (1,)).rows[0]
    assert dense_row.floor_seconds["dense"] == pytest.approx(23.7e-6, rel=0.01)
    assert dense_row.floor_seconds["lowrank"] == pytest.approx(14.8e-6, rel=0.01)


@pytest.mark.parametrize("hardware", sorted(HARDWARE))
def test_no_schedule_beats_its_floor(hardware):
    hw = HARDWARE[hardware]
    for shape in PAPER_MODELS:
        plan = plan_model(hw, shape, 0.8, 128, (1, 16, 128, 512, 2048, 8192))
        for row in plan.rows:
            assert row.seconds["dense"] >= row.floor_seconds["dense"] * (1 - 1e-9)
            assert row.seconds["fused"] >= row.floor_seconds["lowrank"] * (1 - 1e-9)
            assert row.seconds["fused"] <= row.seconds["torch_unfused"] * (1 + 1e-9)
            assert row.traffic["fused"].launches <= 4
            for kernel in row.kernels:
                assert kernel.best in kernel.traffic


def test_bad_token_counts_are_rejected():
    with pytest.raises(ValueError, match="positive"):
        plan_model(H200, PAPER_MODELS[0], 0.8, 128, (0,))
