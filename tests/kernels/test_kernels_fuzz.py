"""Randomised shapes × dtypes × activations × schedules (fixed seed): both ops against float64."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from svdmlp.backends import torch_ref
from svdmlp.kernels import lowrank_gated_mlp, lowrank_linear

pytestmark = pytest.mark.fuzz

CASES = 200
SEED = 20261130
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Case:
    op: str  # "linear" or "gated_mlp"
    dtype: torch.dtype
    activation: str
    leading: tuple[int, ...]  # leading dims of x; their product is the token count M
    hidden: int  # in (linear) / hidden (MLP)
    out: int  # out (linear) / inter (MLP)
    ranks: tuple[int, ...]  # (r,) or (r_gate, r_up, r_down)
    schedule: str | None
    transposed_x: bool  # x given as a transposed view (strides (1, M))

    def __str__(self) -> str:
        dims = (
            f"{'x'.join(map(str, self.leading))}-{self.hidden}-{self.out}-r{'.'.join(map(str, self.ranks))}"
        )
        act = f"-{self.activation}" if self.op == "gated_mlp" else ""
        flags = f"-{self.schedule or 'auto'}{'-T' if self.transposed_x else ''}"
        return f"{self.op}-{str(self.dtype)[6:]}{act}-{dims}{flags}"


def draw_case(rng: random.Random) -> Case:
    op = rng.choice(("linear", "gated_mlp"))
    tokens = rng.choice((1, 1, 2, 3, 5, 8, 13, 16, 17, 24, 33, 64, 100))
    leading = (tokens,) if rng.random() < 0.7 else (rng.choice((1, 2, 3)), tokens)
    ranks = tuple(
        rng.choice((rng.randint(1, 15), rng.randint(16, 90))) for _ in range(1 if op == "linear" else 3)
    )
    if op == "gated_mlp" and rng.random() < 0.5:  # equal gate and up ranks: the merged loop
        ranks = (ranks[0], ranks[0], ranks[2])
    schedules = ("fused", "two_stage") if op == "linear" else ("decode", "prefill")
    return Case(
        op=op,
        dtype=rng.choice(DTYPES),
        activation=rng.choice(("silu", "gelu_tanh")),
        leading=leading,
        hidden=rng.randint(1, 150),
        out=rng.randint(1, 150),
        ranks=ranks,
        schedule=rng.choice((None, *schedules)),
        transposed_x=len(leading) == 1 and rng.random() < 0.25,
    )


def _fused_fits(x: torch.Tensor, rank: int) -> bool:
    """Whether the fused linear runs ``rank`` in ``x``'s dtype here (the interpreter allows more)."""
    from svdmlp.kernels import configs
    from svdmlp.kernels.common import is_interpreted
    from svdmlp.kernels.lowrank_linear import _lowrank_linear_kernel

    interpreted = is_interpreted(_lowrank_linear_kernel)
    return configs.fused_linear_tiles(1, x.shape[-1], rank, 1, x.dtype, 1, interpreted) is not None


_rng = random.Random(SEED)
FUZZ_CASES = [draw_case(_rng) for _ in range(CASES)]


@pytest.mark.parametrize(
    ("index", "case"), [pytest.param(i, c, id=f"{i}-{c}") for i, c in enumerate(FUZZ_CASES)]
)
def test_fuzz_against_float64_reference(kh, index: int, case: Case):
    generator = torch.Generator().manual_seed(SEED + index)
    if case.transposed_x:
        x = kh.random_input(generator, (case.hidden, *case.leading), case.dtype).t()
    else:
        x = kh.random_input(generator, (*case.leading, case.hidden), case.dtype)
    if case.op == "linear":
        (rank,) = case.ranks
        u_t = kh.random_factor(generator, case.hidden, rank, case.dtype)
        v_t = kh.random_factor(generator, rank, case.out, case.dtype)
        if case.schedule == "fused" and not _fused_fits(x, rank):
            # The device's register budget refuses this rank (fp32 above 64 on a GPU): a clear error.
            with pytest.raises(ValueError, match="too large for the fused schedule"):
                lowrank_linear(x, u_t, v_t, schedule=case.schedule)
            return
        y = lowrank_linear(x, u_t, v_t, schedule=case.schedule)
        expected = torch_ref.lowrank_linear(*kh.in_float64(x, u_t, v_t))
    else:
        r_gate, r_up, r_down = case.ranks
        factors = [
            kh.random_factor(generator, case.hidden, r_gate + r_up, case.dtype),
            kh.random_factor(generator, r_gate, case.out, case.dtype),
            kh.random_factor(generator, r_up, case.out, case.dtype),
            kh.random_factor(generator, case.out, r_down, case.dtype),
            kh.random_factor(generator, r_down, case.hidden, case.dtype),
        ]
        y = lowrank_gated_mlp(x, *factors, case.activation, schedule=case.schedule)
        expected = torch_ref.lowrank_gated_mlp(*kh.in_float64(x, *factors), case.activation)
    assert y.dtype == case.dtype
    kh.assert_close_to_reference(y, expected, str(case))
