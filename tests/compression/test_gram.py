import pytest
import torch

from svdmlp.compression import gram


@pytest.mark.parametrize("blocks", [1, 3, 4])
def test_symmetric_gram_equals_the_full_product(blocks):
    x = torch.randn(37, 22, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(gram.symmetric_gram(x, blocks), x.T @ x)


def test_accumulate_adds_each_batch_in_float64():
    target = torch.zeros(5, 5, dtype=torch.float64)
    batches = [torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for x in batches:
        gram.accumulate_gram(target, x)
    flat = torch.cat([x.reshape(-1, 5) for x in batches]).double()
    torch.testing.assert_close(target, flat.T @ flat, rtol=1e-5, atol=1e-5)
