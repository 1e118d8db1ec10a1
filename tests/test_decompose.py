import pytest
import torch

from svdmlp import decompose


def _random_weight(out_f=48, in_f=40, seed=0):
    return torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_full_rank_plain_svd_reproduces_the_weight():
    w = _random_weight()
    factors = decompose.plain_svd(w, min(w.shape))
    assert factors.u.shape == (40, 40) and factors.v.shape == (48, 40)
    torch.testing.assert_close((factors.v @ factors.u).double(), w, atol=1e-5, rtol=1e-5)


def _correlated_gram(dim, seed=1, tokens=4000):
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(dim, dim, generator=g, dtype=torch.float64) * torch.logspace(
        0, -3, dim, dtype=torch.float64
    )
    x = torch.randn(tokens, dim, generator=g, dtype=torch.float64) @ mixing.T
    x[:, 3] *= 30.0  # an outlier channel, as real LLM activations have
    return x.T @ x


def test_full_rank_whitened_svd_reproduces_the_weight():
    w = _random_weight()
    factors = decompose.whitened_svd(w, decompose.Whitening.from_gram(_correlated_gram(40)), 40)
    torch.testing.assert_close((factors.v @ factors.u).double(), w, atol=1e-4, rtol=1e-4)


def test_whitening_beats_plain_svd_on_correlated_inputs():
    w, gram = _random_weight(), _correlated_gram(40)
    for rank in (4, 8, 16):
        plain = decompose.weighted_relative_error(w, decompose.plain_svd(w, rank), gram)
        whitened = decompose.weighted_relative_error(
            w, decompose.whitened_svd(w, decompose.Whitening.from_gram(gram), rank), gram
        )
        assert whitened < 0.7 * plain, (rank, whitened, plain)


def test_whitened_svd_is_optimal_against_random_factors():
    w, gram = _random_weight(), _correlated_gram(40)
    best = decompose.weighted_relative_error(
        w, decompose.whitened_svd(w, decompose.Whitening.from_gram(gram), 8), gram
    )
    g = torch.Generator().manual_seed(5)
    for _ in range(5):
        plain = decompose.plain_svd(w + 0.05 * torch.randn(w.shape, generator=g, dtype=torch.float64), 8)
        assert decompose.weighted_relative_error(w, plain, gram) >= best


def test_whitening_with_identity_gram_matches_plain_svd():
    w = _random_weight()
    a = decompose.plain_svd(w, 10)
    b = decompose.whitened_svd(w, decompose.Whitening.from_gram(torch.eye(40, dtype=torch.float64)), 10)
    torch.testing.assert_close(b.v @ b.u, a.v @ a.u, atol=1e-5, rtol=1e-5)


def test_error_falls_as_rank_grows():
    w, gram = _random_weight(), _correlated_gram(40)
    errors = [
        decompose.weighted_relative_error(
            w, decompose.whitened_svd(w, decompose.Whitening.from_gram(gram), r), gram
        )
        for r in (4, 8, 16, 32)
    ]
    assert errors == sorted(errors, reverse=True)


def test_one_decomposition_gives_every_rank_and_its_error_spectrum():
    w, gram = _random_weight(), _correlated_gram(40)
    whitening = decompose.Whitening.from_gram(gram, ridge=0.0)
    decomposition = decompose.Decomposition.of(w, whitening)
    energy = decomposition.energy
    for rank in (5, 17):
        factors = decomposition.factors(rank)
        assert factors.rank == rank and factors.u.dtype == torch.float32
        # The tail of the spectrum is the activation-weighted truncation error.
        expected = (energy[rank:].sum() / energy.sum()).sqrt()
        error = decompose.weighted_relative_error(w, factors, gram)
        assert error == pytest.approx(float(expected), rel=1e-4)


def test_singular_gram_is_ridged_not_fatal():
    # Rank-deficient inputs (dead channels): plain Cholesky fails on them; the ridge must not.
    g = torch.Generator().manual_seed(2)
    x = torch.randn(100, 40, generator=g, dtype=torch.float64)
    x[:, 20:] = 0.0
    factors = decompose.whitened_svd(_random_weight(), decompose.Whitening.from_gram(x.T @ x), 8)
    assert torch.isfinite(factors.u).all() and torch.isfinite(factors.v).all()


@pytest.mark.parametrize("bad, message", [(float("nan"), "NaN or inf"), (0.0, "zero")])
def test_bad_grams_are_clear_errors(bad, message):
    gram = torch.full((40, 40), bad, dtype=torch.float64)
    with pytest.raises(ValueError, match=message):
        decompose.Whitening.from_gram(gram)


def test_an_indefinite_gram_is_a_clear_error():
    gram = torch.diag(torch.tensor([4.0, 1.0, -2.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="not positive semi-definite"):
        decompose.Whitening.from_gram(gram)


def test_the_gram_is_left_untouched():
    gram = _correlated_gram(12)
    before = gram.clone()
    decompose.Whitening.from_gram(gram, damping=0.5)
    assert torch.equal(gram, before)


def test_weighted_error_without_gram_is_frobenius():
    w = _random_weight()
    factors = decompose.plain_svd(w, 5)
    expected = float((w - factors.v.double() @ factors.u.double()).norm() / w.norm())
    assert decompose.weighted_relative_error(w, factors, None) == pytest.approx(expected)


def test_whitening_is_a_triangular_root_of_the_gram():
    gram = _correlated_gram(12)
    whitening = decompose.Whitening.from_gram(gram, ridge=0.0)
    torch.testing.assert_close(whitening.lower, whitening.lower.tril(), rtol=0, atol=0)
    torch.testing.assert_close(whitening.gram(), gram, rtol=1e-8, atol=1e-6)
    ridged = decompose.Whitening.from_gram(gram).gram() - gram
    top = float(torch.linalg.eigvalsh(gram).max())
    torch.testing.assert_close(
        ridged, decompose.RIDGE * top * torch.eye(12, dtype=torch.float64), rtol=1e-3, atol=1e-9 * top
    )


@pytest.mark.parametrize("n", [1, 3, 4, 13])
def test_weighting_through_the_root_skips_only_zero_blocks(n):
    """``W·L`` and ``Lᵀ·W`` made strip by strip over the triangle equal the full products, for widths
    below, at and off the number of strips."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n + 3, n, generator=g, dtype=torch.float64)
    whitening = decompose.Whitening.from_gram(x.T @ x)
    w_in = torch.randn(7, n, generator=g, dtype=torch.float64)
    w_out = torch.randn(n, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(whitening.right(w_in), w_in @ whitening.lower, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(whitening.left(w_out), whitening.lower.mT @ w_out, rtol=1e-12, atol=1e-12)


# Two-sided (output-aware) factorisation: ‖S_out·(W − VU)·S_in‖_F.


def _two_sided_error(w, factors, input_gram, output_gram):
    return decompose.weighted_relative_error(w, factors, input_gram, output_gram)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_sided_is_never_worse_than_input_whitening_on_its_own_objective(seed):
    w = _random_weight(seed=seed)
    input_gram, output_gram = _correlated_gram(40, seed=seed + 10), _correlated_gram(48, seed=seed + 20)
    whitening, output = decompose.Whitening.from_gram(input_gram), decompose.Whitening.from_gram(output_gram)
    for rank in (4, 8, 16, 32):
        two_sided = _two_sided_error(
            w, decompose.two_sided_svd(w, whitening, output, rank), input_gram, output_gram
        )
        whitened = _two_sided_error(w, decompose.whitened_svd(w, whitening, rank), input_gram, output_gram)
        assert two_sided <= whitened * (1 + 1e-9), (rank, two_sided, whitened)
        if rank < 32:
            assert two_sided < 0.9 * whitened, (rank, two_sided, whitened)  # a correlated G_out matters


def test_two_sided_is_optimal_against_perturbed_factors():
    w, input_gram, output_gram = _random_weight(), _correlated_gram(40), _correlated_gram(48, seed=7)
    whitening, output = decompose.Whitening.from_gram(input_gram), decompose.Whitening.from_gram(output_gram)
    best_factors = decompose.two_sided_svd(w, whitening, output, 8)
    best = _two_sided_error(w, best_factors, input_gram, output_gram)
    g = torch.Generator().manual_seed(5)
    for _ in range(5):
        u = best_factors.u + 1e-3 * best_factors.u.abs().mean() * torch.randn(
            best_factors.u.shape, generator=g
        )
        v = best_factors.v + 1e-3 * best_factors.v.abs().mean() * torch.randn(
            best_factors.v.shape, generator=g
        )
        assert _two_sided_error(w, decompose.Factors(u=u, v=v), input_gram, output_gram) >= best


@pytest.mark.parametrize("scale", [1.0, 37.0])
def test_two_sided_with_a_uniform_output_gram_is_input_whitening(scale):
    w, input_gram = _random_weight(), _correlated_gram(40)
    whitening = decompose.Whitening.from_gram(input_gram)
    output = decompose.Whitening.from_gram(scale * torch.eye(48, dtype=torch.float64))
    for rank in (5, 12):
        a = decompose.whitened_svd(w, whitening, rank)
        b = decompose.two_sided_svd(w, whitening, output, rank)
        torch.testing.assert_close(
            b.v.double() @ b.u.double(), a.v.double() @ a.u.double(), atol=1e-5, rtol=1e-5
        )


def test_heavy_damping_tends_to_input_whitening():
    w, input_gram, output_gram = _random_weight(), _correlated_gram(40), _correlated_gram(48, seed=7)
    whitening = decompose.Whitening.from_gram(input_gram)
    reference = decompose.whitened_svd(w, whitening, 8)
    distances = []
    for damping in (0.0, 1.0, 1e6):
        output = decompose.Whitening.from_gram(output_gram, damping=damping)
        factors = decompose.two_sided_svd(w, whitening, output, 8)
        distances.append(
            float(
                (factors.v.double() @ factors.u.double() - reference.v.double() @ reference.u.double()).norm()
            )
        )
    assert distances[0] > distances[1] > distances[2] and distances[2] < 1e-4 * float(w.norm())


def _damped(gram, damping):
    return gram + damping * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)


def test_damped_whitening_is_the_root_of_the_damped_gram():
    gram = _correlated_gram(12)
    for damping in (0.0, 0.1, 3.0):
        damped = decompose.Whitening.from_gram(gram, ridge=0.0, damping=damping)
        torch.testing.assert_close(damped.gram(), _damped(gram, damping), rtol=1e-8, atol=1e-6)
        assert damped.shift == pytest.approx(damping * float(gram.diagonal().mean()))
    with pytest.raises(ValueError, match="damping"):
        decompose.Whitening.from_gram(gram, damping=-1.0)


def test_full_rank_two_sided_reproduces_the_weight():
    w = _random_weight()
    whitening = decompose.Whitening.from_gram(_correlated_gram(40))
    output = decompose.Whitening.from_gram(_correlated_gram(48, seed=3))
    factors = decompose.two_sided_svd(w, whitening, output, 40)
    assert factors.u.shape == (40, 40) and factors.v.shape == (48, 40)
    torch.testing.assert_close((factors.v @ factors.u).double(), w, atol=1e-4, rtol=1e-4)


def test_two_sided_spectrum_tail_is_its_error():
    w, input_gram, output_gram = _random_weight(), _correlated_gram(40), _correlated_gram(48, seed=4)
    decomposition = decompose.Decomposition.of(
        w,
        decompose.Whitening.from_gram(input_gram, ridge=0.0),
        decompose.Whitening.from_gram(output_gram, ridge=0.0),
    )
    energy = decomposition.energy
    for rank in (3, 20):
        expected = (energy[rank:].sum() / energy.sum()).sqrt()
        error = _two_sided_error(w, decomposition.factors(rank), input_gram, output_gram)
        assert error == pytest.approx(float(expected), rel=1e-4)


def test_output_only_weighting_is_optimal_for_its_objective():
    w, output_gram = _random_weight(), _correlated_gram(48, seed=6)
    factors = decompose.Decomposition.of(w, None, decompose.Whitening.from_gram(output_gram)).factors(8)
    best = _two_sided_error(w, factors, None, output_gram)
    assert best < _two_sided_error(w, decompose.plain_svd(w, 8), None, output_gram)
    # The objective itself: tr(G_o·E·Eᵀ) / tr(G_o·W·Wᵀ).
    err = w - factors.v.double() @ factors.u.double()
    expected = ((output_gram @ err @ err.T).trace() / (output_gram @ w @ w.T).trace()).sqrt()
    assert best == pytest.approx(float(expected), rel=1e-9)


def test_two_sided_handles_singular_grams_on_both_sides():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(100, 40, generator=g, dtype=torch.float64)
    x[:, 20:] = 0.0  # dead input channels
    grads = torch.randn(30, 48, generator=g, dtype=torch.float64)  # fewer tokens than outputs: rank 30
    whitening = decompose.Whitening.from_gram(x.T @ x)
    output = decompose.Whitening.from_gram(grads.T @ grads)
    w = _random_weight()
    factors = decompose.two_sided_svd(w, whitening, output, 8)
    assert torch.isfinite(factors.u).all() and torch.isfinite(factors.v).all()
    full = decompose.two_sided_svd(w, whitening, output, 40)
    torch.testing.assert_close((full.v @ full.u).double(), w, atol=1e-3, rtol=1e-3)


def test_existing_decomposition_api_is_unchanged_without_an_output():
    w, gram = _random_weight(), _correlated_gram(40)
    whitening = decompose.Whitening.from_gram(gram)
    decomposition = decompose.Decomposition.of(w, whitening)
    assert decomposition.output is None
    a = decompose.Decomposition.of_rotated(w @ whitening.lower, whitening).factors(7)
    b = decomposition.factors(7)
    torch.testing.assert_close(a.v @ a.u, b.v @ b.u)
    assert decompose.weighted_relative_error(w, b, gram) == decompose.weighted_relative_error(
        w, b, gram, None
    )


def test_a_reloadable_gram_becomes_its_root_and_a_failed_attempt_reloads():
    gram = _correlated_gram(12)
    expected = decompose.Whitening.from_gram(gram.clone()).lower
    mine = gram.clone()
    whitening = decompose.Whitening.from_gram(mine, reload=gram.clone)
    assert whitening.lower.data_ptr() == mine.data_ptr()  # no second buffer
    torch.testing.assert_close(whitening.lower, expected, rtol=0, atol=0)
    # Slightly indefinite, as rounding leaves a Gram: the first ridge fails, the next on a fresh copy works.
    top = float(torch.linalg.eigvalsh(gram).max())
    indefinite = gram - 3e-6 * top * torch.eye(12, dtype=torch.float64)
    reloads = []
    root = decompose.Whitening.from_gram(
        indefinite.clone(), reload=lambda: reloads.append(1) or indefinite.clone()
    )
    assert reloads == [1] and torch.isfinite(root.lower).all()


@pytest.mark.parametrize("shape", [(48, 40), (24, 61)])  # tall (gate, up) and wide (down)
def test_decomposition_is_the_svd_of_tall_and_wide_weights(shape):
    w = _random_weight(*shape, seed=3)
    gram = _correlated_gram(shape[1])
    whitening = decompose.Whitening.from_gram(gram)
    decomposition = decompose.Decomposition.of(w, whitening)
    k = min(shape)
    assert decomposition.left.shape == (shape[0], k) and decomposition.right_h.shape == (k, shape[1])
    eye = torch.eye(k, dtype=torch.float64)
    torch.testing.assert_close(decomposition.left.mT @ decomposition.left, eye, atol=1e-10, rtol=0)
    torch.testing.assert_close(decomposition.right_h @ decomposition.right_h.mT, eye, atol=1e-10, rtol=0)
    rotated = whitening.right(w)
    torch.testing.assert_close(
        decomposition.left * decomposition.sigma @ decomposition.right_h, rotated, atol=1e-9, rtol=0
    )
    # The truncation is the best rank-r approximation (Eckart-Young), whichever way it was computed.
    left, sigma, right_h = torch.linalg.svd(rotated, full_matrices=False)
    best = whitening.right_inverse(left[:, :7] * sigma[:7] @ right_h[:7])
    factors = decomposition.factors(7)
    torch.testing.assert_close((factors.v.double() @ factors.u.double()), best, atol=1e-5, rtol=1e-5)
