"""Block choice: the paper's trn1 block-size study, and GPU blocks that fit shared memory."""

import pytest

from svdmlp.plan.hardware import HARDWARE, MIB, TRN1
from svdmlp.plan.planner import mlp_ranks, plan_kernel
from svdmlp.plan.shapes import PAPER_MODELS
from svdmlp.plan.tiles import (
    TRN_BK,
    TRN_BN,
    TRN_BR,
    TRN_TOKEN_BLOCKS,
    block_size_study,
    choose_blocks,
)


def test_trn1_block_size_study_reproduces_the_paper_choice():
    # paper.md §4.1: r = 4096 (DeepSeek-V3 MLP at keep 0.8); BM = 1024 is the largest block whose
    # strip and streamed blocks fit the 24 MiB SBUF, and 2048 spills.
    rows = block_size_study(TRN1, 4096, TRN_TOKEN_BLOCKS, TRN_BK, TRN_BR, TRN_BN)
    fits = {row.bm: row.fits for row in rows}
    assert fits == {128: True, 256: True, 512: True, 1024: True, 2048: False, 4096: False}
    by_bm = {row.bm: row for row in rows}
    assert by_bm[1024].onchip_bytes == 13 * MIB
    assert by_bm[2048].spill_bytes == 1 * MIB
    assert by_bm[1024].intensity == pytest.approx(819.2)
    # The planner picks it for the paper's §5.3 shape: M=4096, K=7168, r=4096, N=18432.
    assert choose_blocks(TRN1, 4096, 7168, 18432, 4096).bm == 1024


def test_trainium_block_is_capped_by_the_tokens():
    assert choose_blocks(TRN1, 1, 2048, 8192, 1280).bm == 128
    assert choose_blocks(TRN1, 300, 2048, 8192, 1280).bm == 256


@pytest.mark.parametrize("hardware", ["h200", "h100"])
@pytest.mark.parametrize("keep", [0.6, 0.8])
def test_hopper_blocks_fit_shared_memory_for_every_paper_shape(hardware, keep):
    hw = HARDWARE[hardware]
    for shape in PAPER_MODELS:
        ranks = mlp_ranks(shape, keep, 128)
        for m in (1, 16, 128, 512, 2048, 8192):
            for k, n, r in (
                (shape.hidden, shape.intermediate, ranks.gate + ranks.up),
                (shape.intermediate, shape.hidden, ranks.down),
            ):
                blocks = choose_blocks(hw, m, k, n, r)
                assert blocks.fits, (shape.name, m, r)
                assert blocks.onchip_bytes <= hw.onchip_bytes
                assert blocks.bm in (16, 32, 64, 128) and blocks.bm <= max(16, m)
                assert r % blocks.br == 0 and blocks.num_stages in (2, 3)


def test_a_strip_that_spills_is_never_planned():
    # A100's 163 KiB cannot hold a 16-row strip of the 8B models' gate+up (r = 5120: 160 KiB) plus
    # its streamed blocks: the planner must fall back to a schedule without the cached strip.
    hw = HARDWARE["a100"]
    blocks = choose_blocks(hw, 1, 4096, 14336, 5120)
    assert not blocks.fits
    kernel = plan_kernel(hw, "gate_up", 1, 4096, 14336, 5120)
    assert "strip" not in kernel.traffic and kernel.best in ("round_trip", "naive")
