"""The steps' clock: seconds by step over the runs of a compression."""

from svdmlp.compression import clock as clock_module
from svdmlp.compression.clock import StepClock


def test_each_span_counts_toward_its_step_and_the_running_one_up_to_now(monkeypatch):
    now = iter([10.0, 13.0, 14.5, 20.0, 21.0, 30.0])
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: next(now))
    clock = StepClock({"calibration": 100.0})  # an earlier run's
    clock.switch("calibration")  # 10
    clock.switch("factorisation")  # 13
    clock.switch("calibration")  # 14.5
    assert clock.totals() == {"calibration": 108.5, "factorisation": 1.5}  # at 20, the running span too
    clock.switch(None)  # 21
    assert clock.totals() == {"calibration": 109.5, "factorisation": 1.5}
    assert clock.totals() == clock.spent  # nothing runs: no time passes
