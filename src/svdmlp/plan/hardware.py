"""Hardware profiles for the tile planner, as data.

The planner needs four numbers per device: how many bytes the fastest on-chip memory gives one block
of work (shared memory per thread block on a GPU, SBUF on a NeuronCore: the budget of the paper's
Eq. 11), how much hardware cache can absorb re-reads (L2; none on Trainium, whose memories are all
software-managed), and the two roofline ceilings (HBM bandwidth, bf16 matrix peak). Where a number
was measured on this project's machine it is used in place of the datasheet's, and both are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class Hardware:
    """One device as the planner sees it.

    Attributes:
        name: display name.
        kind: "gpu" (hardware L2, thread blocks over SMs) or "trainium" (one NeuronCore, explicit SBUF).
        units: processors that run blocks of work concurrently (SMs; 1 for one NeuronCore).
        onchip_bytes: on-chip memory one block of work may use (shared memory per block, or SBUF).
        cache_bytes: hardware cache that can serve re-reads of an operand (L2; 0 on Trainium).
        bandwidth: HBM bytes/s the planner uses (measured where known, else nominal).
        peak_flops: bf16 dense matrix FLOP/s the planner uses (measured where known, else nominal).
        nominal_bandwidth: datasheet HBM bytes/s.
        nominal_flops: datasheet bf16 dense FLOP/s.
        source: where the numbers come from.
    """

    name: str
    kind: str
    units: int
    onchip_bytes: int
    cache_bytes: int
    bandwidth: float
    peak_flops: float
    nominal_bandwidth: float
    nominal_flops: float
    source: str

    @property
    def ridge(self) -> float:
        """FLOPs per HBM byte above which a kernel is compute-bound (peak / bandwidth)."""
        return self.peak_flops / self.bandwidth

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "units": self.units,
            "onchip_bytes": self.onchip_bytes,
            "cache_bytes": self.cache_bytes,
            "bandwidth": self.bandwidth,
            "peak_flops": self.peak_flops,
            "nominal_bandwidth": self.nominal_bandwidth,
            "nominal_flops": self.nominal_flops,
            "ridge": self.ridge,
            "source": self.source,
        }


# Hopper (compute capability 9.0): 228 KB shared memory per SM, of which one block may opt in to
# 227 KB (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"); Triton
# checks its kernels against that opt-in limit.
_HOPPER_SMEM_PER_BLOCK = 227 * KIB
# Ampere A100 (compute capability 8.0): 164 KB per SM, 163 KB opt-in per block (same table).
_A100_SMEM_PER_BLOCK = 163 * KIB

H200 = Hardware(
    name="H200",
    kind="gpu",
    units=132,
    onchip_bytes=_HOPPER_SMEM_PER_BLOCK,
    # PyTorch reports 60 MB of L2 on this project's H200 (design.md §4, device notes 2026-10-28).
    cache_bytes=60 * MIB,
    # Measured on this project's H200 (design.md §5): device copy 4.26 TB/s counting read + write,
    # 8192³ bf16 matmul 782 TFLOP/s on random data. Datasheet: 4.8 TB/s HBM3e, 989 TFLOP/s bf16 dense.
    bandwidth=4.26e12,
    peak_flops=782e12,
    nominal_bandwidth=4.8e12,
    nominal_flops=989e12,
    source="NVIDIA H200 datasheet; bandwidth and peak measured here (design.md §5)",
)

H100 = Hardware(
    name="H100 SXM",
    kind="gpu",
    units=132,
    onchip_bytes=_HOPPER_SMEM_PER_BLOCK,
    cache_bytes=50 * MIB,  # H100 SXM5 enables 50 MB of the die's 60 MB (Hopper whitepaper)
    # Datasheet only (no measurement here): 3.35 TB/s HBM3, 989 TFLOP/s bf16 dense.
    bandwidth=3.35e12,
    peak_flops=989e12,
    nominal_bandwidth=3.35e12,
    nominal_flops=989e12,
    source="NVIDIA H100 SXM datasheet and Hopper whitepaper (nominal, not measured here)",
)

A100 = Hardware(
    name="A100 80GB SXM",
    kind="gpu",
    units=108,
    onchip_bytes=_A100_SMEM_PER_BLOCK,
    cache_bytes=40 * MIB,  # Ampere whitepaper: 40 MB L2
    # Datasheet only: 2.039 TB/s HBM2e (80 GB SXM), 312 TFLOP/s bf16 dense.
    bandwidth=2.039e12,
    peak_flops=312e12,
    nominal_bandwidth=2.039e12,
    nominal_flops=312e12,
    source="NVIDIA A100 80GB datasheet and Ampere whitepaper (nominal, not measured here)",
)

# Trainium profiles model ONE NeuronCore, as the paper's Eq. 11 does (its SBUF budget is per core).
# trn1 (NeuronCore-v2): 24 MiB SBUF = 128 partitions × 192 KiB, 2 MiB PSUM (paper.md §2; AWS NKI
# Trainium/Inferentia2 architecture guide). A Trainium chip has 2 cores, 32 GiB HBM at 820 GB/s and
# 190 TFLOP/s bf16 (AWS Trainium architecture page); per core that is 410 GB/s and 95 TFLOP/s, a
# ridge of 232 FLOP/B against the paper's quoted 222.
TRN1 = Hardware(
    name="trn1 NeuronCore-v2",
    kind="trainium",
    units=1,
    onchip_bytes=24 * MIB,
    cache_bytes=0,
    bandwidth=820e9 / 2,
    peak_flops=190e12 / 2,
    nominal_bandwidth=820e9 / 2,
    nominal_flops=190e12 / 2,
    source="paper.md §2 (SBUF 24 MiB); AWS Trainium docs (per chip 820 GB/s, 190 TFLOP/s, 2 cores)",
)

# trn2 (NeuronCore-v3): 28 MiB SBUF per core (AWS Trainium3 NKI guide: "32 MiB, up from 28 MiB in
# NeuronCore-v3"; paper.md §7), PSUM 2 MiB as on trn1. A Trainium2 chip has 8 cores, 2.9 TB/s HBM
# and 667 TFLOP/s bf16 dense (AWS Trainium2 architecture page): per core 362 GB/s, 83 TFLOP/s.
TRN2 = Hardware(
    name="trn2 NeuronCore-v3",
    kind="trainium",
    units=1,
    onchip_bytes=28 * MIB,
    cache_bytes=0,
    bandwidth=2.9e12 / 8,
    peak_flops=667e12 / 8,
    nominal_bandwidth=2.9e12 / 8,
    nominal_flops=667e12 / 8,
    source="AWS Trainium2/3 architecture guides (SBUF 28 MiB; per chip 2.9 TB/s, 667 TFLOP/s, 8 cores)",
)

HARDWARE: dict[str, Hardware] = {"h200": H200, "h100": H100, "a100": A100, "trn1": TRN1, "trn2": TRN2}


def get_hardware(name: str) -> Hardware:
    """The profile called ``name`` (case-insensitive)."""
    try:
        return HARDWARE[name.lower()]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r}; expected one of {sorted(HARDWARE)}") from None
