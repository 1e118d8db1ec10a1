import pytest
import torch

from svdmlp.compression import gram


@pytest.mark.parametrize("blocks", [1, 3, 4])
def test_accumulate_adds_each_batch_in_float64(blocks):
    target = torch.zeros(22, 22, dtype=torch.float64)
    batches = [torch.randn(2, 19, 22, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for x in batches:
        gram.accumulate_gram(target, x, blocks)
    flat = torch.cat([x.reshape(-1, 22) for x in batches]).double()
    torch.testing.assert_close(target, flat.T @ flat, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks", [1, 3, 4])
def test_accumulate_product_adds_each_batch_in_float64(blocks):
    target = torch.zeros(22, 22, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randn(37, 22, generator=g), torch.randn(37, 22, generator=g)) for _ in range(2)]
    for a, b in pairs:
        gram.accumulate_product(target, a, b, blocks)
    expected = sum(a.double().T @ b.double() for a, b in pairs)
    torch.testing.assert_close(target, expected, rtol=1e-5, atol=1e-5)
