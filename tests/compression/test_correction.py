"""A quantized weight's low-rank correction: the whitened best rank-r approximation of the rounding error,
checked against a float64 SVD of the error seen through the calibration inputs."""

import pytest
import torch

from svdmlp import decompose
from svdmlp.compression.correction import corrected
from svdmlp.int_weights import dequantize, gptq, scheme


def _problem(rows=40, cols=72, tokens=300, seed=0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    # inputs with a few strong directions, as activations have
    x = (
        torch.randn(tokens, cols, generator=generator, dtype=torch.float64)
        * torch.logspace(1, -1, cols).double()
    )
    gram = x.T @ x
    return weight.float(), gram, x


def _output_error(weight, restored, x) -> float:
    return float(((weight.double() - restored.double()) @ x.T).norm() / (weight.double() @ x.T).norm())


@pytest.mark.parametrize("name", ["int3g8", "int2g16-asym"])
@pytest.mark.parametrize("rank", [1, 8, 24])
def test_the_correction_is_the_best_rank_r_fit_of_the_error_through_the_inputs(rank, name):
    weight, gram, x = _problem(seed=rank)
    how = scheme(name)
    whitening = decompose.Whitening.from_gram(gram, ridge=0.0)
    fixed = corrected(weight, gram, whitening, how, rank, rounds=0)
    q, scales = gptq(weight, gram, how)
    assert torch.equal(fixed.q, q) and torch.equal(fixed.scales, scales)  # rounds=0: GPTQ's own rounding
    error = weight.double() - dequantize(q, scales, tuple(weight.shape)).double()
    # the best rank-r approximation of E·Xᵀ leaves exactly its trailing singular values (Eckart-Young)
    sigma = torch.linalg.svdvals(error @ x.T)
    left = error - fixed.correction.v.double() @ fixed.correction.u.double()
    assert float((left @ x.T).norm()) == pytest.approx(float(sigma[rank:].norm()), rel=1e-5)


def test_correction_lowers_the_output_error_and_more_rank_lowers_it_more():
    weight, gram, x = _problem()
    how = scheme("int2g8")
    whitening = decompose.Whitening.from_gram(gram, ridge=0.0)
    q, scales = gptq(weight, gram, how)
    errors = [_output_error(weight, dequantize(q, scales, tuple(weight.shape)), x)]
    for rank in (4, 16, 32):
        for rounds in (0, 1):
            fixed = corrected(weight, gram, whitening, how, rank, rounds)
            restored = (
                dequantize(fixed.q, fixed.scales, tuple(weight.shape))
                + fixed.correction.v @ fixed.correction.u
            )
            errors.append(_output_error(weight, restored, x))
            assert torch.isfinite(restored).all()
    no_correction, rank4, rank4_round, rank16, _, rank32, _ = errors
    assert rank4 < no_correction and rank16 < rank4 and rank32 < rank16
    assert rank4_round < no_correction
