"""The stand-ins the recorded launches run on, against what they stand for."""

from __future__ import annotations

from svdmlp.int_weights import SCHEMES, QuantizedMatrix
from svdmlp.kernels.capture import QUANTIZED_LAYOUTS, meta_quantized


def test_quantized_stand_ins_are_stored_as_quantized_matrices_are():
    """The kernels' description of the schemes (they sit a layer below int_weights) matches theirs."""
    assert [(layout.bits, layout.group) for layout in QUANTIZED_LAYOUTS] == [
        (how.bits, how.group) for how in SCHEMES.values()
    ]
    for layout, how in zip(QUANTIZED_LAYOUTS, SCHEMES.values(), strict=True):
        for k, n in ((131, 7), (256, 40)):
            stand_in, real = meta_quantized(k, n, layout), QuantizedMatrix(k, n, how, device="meta")
            assert (stand_in.in_features, stand_in.out_features) == (real.in_features, real.out_features)
            for name in ("values", "scales"):
                stored, expected = getattr(stand_in, name), getattr(real, name)
                assert (stored.shape, stored.dtype) == (expected.shape, expected.dtype), (how.name, name)
