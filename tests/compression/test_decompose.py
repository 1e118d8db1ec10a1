import pytest
import torch

from svdmlp.compression import decompose


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
    whitening = decompose.Whitening.from_gram(gram, floor=0.0)
    decomposition = decompose.Decomposition.of(w, whitening)
    energy = decomposition.energy
    for rank in (5, 17):
        factors = decomposition.factors(rank)
        assert factors.rank == rank and factors.u.dtype == torch.float32
        # The tail of the spectrum is the activation-weighted truncation error.
        expected = (energy[rank:].sum() / energy.sum()).sqrt()
        error = decompose.weighted_relative_error(w, factors, gram)
        assert error == pytest.approx(float(expected), rel=1e-4)


def test_singular_gram_is_floored_not_fatal():
    # Rank-deficient inputs (dead channels): Cholesky would fail; the eigenvalue floor must not.
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


def test_weighted_error_without_gram_is_frobenius():
    w = _random_weight()
    factors = decompose.plain_svd(w, 5)
    expected = float((w - factors.v.double() @ factors.u.double()).norm() / w.norm())
    assert decompose.weighted_relative_error(w, factors, None) == pytest.approx(expected)


def test_whitening_is_the_symmetric_root_of_the_gram():
    gram = _correlated_gram(12)
    whitening = decompose.Whitening.from_gram(gram, floor=0.0)
    root = whitening.matrix()
    torch.testing.assert_close(root, root.T)
    torch.testing.assert_close(root @ root, gram, rtol=1e-8, atol=1e-6)
