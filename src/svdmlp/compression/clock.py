"""The wall seconds a compression spends in each of its steps, summed over the runs that made it.

A big model's compression is stopped and continued (:mod:`svdmlp.compression.journal`):
Qwen2.5-Coder-1.5B's at keep 0.8 took about 6 h of compute over three sessions. Its report counts every
run's time, not the last run's (one that only restores finished layers and heals takes minutes). The
journal keeps the totals with each record it writes, so a continued run starts from them; a run killed
outright (SIGKILL, out of memory) loses its time since its last record.
"""

from __future__ import annotations

import time


class StepClock:
    """Seconds by step; one step runs at a time, and :meth:`totals` counts it up to now."""

    def __init__(self, spent: dict[str, float] | None = None):
        self.spent = dict(spent or {})  # the finished spans, by step
        self._step: str | None = None
        self._since = 0.0

    def switch(self, step: str | None) -> None:
        """End the running step's span and start ``step``'s (None: no step runs)."""
        now = time.perf_counter()
        if self._step is not None:
            self.spent[self._step] = self.spent.get(self._step, 0.0) + now - self._since
        self._step, self._since = step, now

    def totals(self) -> dict[str, float]:
        """Seconds by step, the running one counted up to now."""
        totals = dict(self.spent)
        if self._step is not None:
            totals[self._step] = totals.get(self._step, 0.0) + time.perf_counter() - self._since
        return totals
