"""The five factors of a low-rank gated MLP, named once, in the order every kernel takes them.

The kernels, the backends, the modules and the benchmarks all pass a gated MLP's factors as one
:class:`GatedFactors`; its field order is the argument order of the functional ops
(``op(x, *factors, activation)``), so no other place spells it out. A field holds a float tensor or a
quantized matrix (:class:`svdmlp.int_weights.QuantizedMatrix`); all five are one kind.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class GatedFactors(NamedTuple):
    """``down(act(gate(x)) · up(x))`` as ``(K, N)`` factors: ``y = (x @ u_t) @ v_t`` per projection,
    gate's and up's ``u_t`` side by side so that one read of ``x`` serves both (gate's columns first)."""

    gate_up_u_t: Any  # (hidden, r_gate + r_up)
    gate_v_t: Any  # (r_gate, inter)
    up_v_t: Any  # (r_up, inter)
    down_u_t: Any  # (inter, r_down)
    down_v_t: Any  # (r_down, hidden)


FACTORS = GatedFactors._fields
