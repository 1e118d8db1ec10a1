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


@pytest.mark.parametrize("rows", [1, 5, 16, 1000])
def test_buffered_gram_equals_accumulating_every_batch(rows):
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(*shape, 9, generator=g) for shape in [(7,), (1, 3), (2, 6), (4,)]]
    direct = torch.zeros(9, 9, dtype=torch.float64)
    for x in batches:
        gram.accumulate_gram(direct, x)
    target = torch.zeros(9, 9, dtype=torch.float64)
    buffered = gram.BufferedGram(target, rows)
    for x in batches:
        buffered.add(x)
    buffered.flush()
    torch.testing.assert_close(target, direct, rtol=1e-6, atol=1e-6)
    buffered.flush()  # nothing left: a second flush adds nothing
    torch.testing.assert_close(target, direct, rtol=1e-6, atol=1e-6)


def test_buffered_gram_holds_at_most_its_rows_until_flushed():
    target = torch.zeros(3, 3, dtype=torch.float64)
    buffered = gram.BufferedGram(target, rows=4)
    buffered.add(torch.ones(3, 3))
    assert buffered.buffer.shape == (4, 3) and not target.any()
    buffered.add(torch.ones(2, 3))  # the fourth row fills the buffer: one update, one row left
    assert float(target[0, 0]) == 4 and buffered.filled == 1
    buffered.flush()
    assert float(target[0, 0]) == 5 and buffered.filled == 0


def test_buffered_gram_refuses_an_empty_buffer():
    with pytest.raises(ValueError, match="rows must be >= 1"):
        gram.BufferedGram(torch.zeros(2, 2, dtype=torch.float64), rows=0)
