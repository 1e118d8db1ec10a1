"""The planner's arithmetic on cases small enough to count by hand, and the paper's Eq. 10/11 values."""

import pytest

from svdmlp.plan import cost


def test_dense_bytes_and_flops():
    # x 2×3, W 3×4, y 2×4 in 2-byte elements: (6 + 12 + 8)·2 bytes, 2·2·3·4 FLOPs.
    assert cost.dense(2, 3, 4, 2) == cost.Traffic(52, 48, 1)
    # A weight read three times adds 2·12·2 bytes.
    assert cost.dense(2, 3, 4, 2, w_passes=3).hbm_bytes == 52 + 48


def test_round_trip_adds_the_intermediate_both_ways():
    # x 2×3, U 3×1, the 2×1 intermediate written and read, V 1×4, y 2×4: (6 + 3 + 2·2 + 4 + 8)·2.
    assert cost.round_trip(2, 3, 4, 1, 2) == cost.Traffic(50, 2 * 2 * 1 * (3 + 4), 2)


def test_fused_counts_padding_recomputation_and_passes():
    # m=3 in blocks of 2 → 4 rows executed; the strip (x·U) is computed twice (splits=2).
    traffic = cost.fused(3, 4, 8, 2, 2, bm=2, splits=2)
    assert traffic.flops == 2 * 4 * 4 * 2 * 2 + 2 * 4 * 2 * 8
    assert traffic.hbm_bytes == 2 * (3 * 4 + 4 * 2 + 2 * 8 + 3 * 8)
    assert traffic.launches == 1
    reread = cost.fused(3, 4, 8, 2, 2, bm=2, splits=2, x_passes=2, u_passes=3, v_passes=2)
    assert reread.hbm_bytes == 2 * (2 * 12 + 3 * 8 + 2 * 16 + 24)


def test_elementwise_and_sum():
    assert cost.elementwise(5, 3, 2) == cost.Traffic(16, 0, 1)
    assert cost.Traffic(1, 2, 1) + cost.Traffic(10, 20, 2) == cost.Traffic(11, 22, 3)


def test_weight_passes_half_the_cache_absorbs_rereads():
    assert cost.weight_passes(10, 7, cache_bytes=20) == 1
    assert cost.weight_passes(11, 7, cache_bytes=20) == 7
    assert cost.weight_passes(1, 7, cache_bytes=0) == 7  # Trainium: no hardware cache


def test_mlp_ideal_dense_and_lowrank():
    # h=2, i=3, one token: dense weights 3·2·3 = 18; rank-1 factors 3·(2+3) = 15.
    assert cost.mlp_ideal(1, 2, 3, None, 2) == cost.Traffic(2 * (2 * 2 + 18), 2 * 3 * 2 * 3, 0)
    assert cost.mlp_ideal(1, 2, 3, (1, 1, 1), 2) == cost.Traffic(2 * (2 * 2 + 15), 2 * 15, 0)


def test_floor_is_the_larger_of_memory_and_compute_time():
    traffic = cost.Traffic(hbm_bytes=100, flops=1000, launches=1)
    assert cost.floor_seconds(traffic, bandwidth=10, peak_flops=1000) == 10
    assert cost.floor_seconds(traffic, bandwidth=1000, peak_flops=10) == 100


@pytest.mark.parametrize(
    ("bm", "expected"),
    # paper.md §4.1, "[derived] AI from Eq. 10" column (r = 4096, bf16).
    [(128, 124.1), (256, 240.9), (512, 455.1), (1024, 819.2), (2048, 1365.3), (4096, 2048.0)],
)
def test_eq10_arithmetic_intensity(bm, expected):
    assert cost.arithmetic_intensity(4096, bm, 2) == pytest.approx(expected, abs=0.05)


def test_eq11_onchip_bytes():
    # (BM·r + (BM + BR)·max(BK, BN))·s = (1024·4096 + 1280·2048)·2.
    assert cost.onchip_bytes(1024, 4096, 256, 512, 2048, 2) == 13_631_488
    # Pipelining multiplies only the streamed blocks.
    assert cost.onchip_bytes(16, 100, 64, 64, 128, 2, stages=3) == (1600 + 3 * 80 * 128) * 2
