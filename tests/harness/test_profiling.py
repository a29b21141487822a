"""The profiler's sums on the CPU, with the profiled events stood in for: a flush's kernels are
left out of the measured call's time, and a measured call that launches a kernel named as the
flush's is refused (the GPU tests run the same on a device)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gdn_evidence.harness import profiling


@dataclass
class Span:
    us: float

    def elapsed_us(self) -> float:
        return self.us


@dataclass
class Event:
    name: str
    time_range: Span


@pytest.fixture
def launches(monkeypatch):
    """Each stand-in function appends its kernels to ``launched``; ``device_events`` returns what
    the calls it profiles appended."""
    launched: list[Event] = []

    def device_events(calls):
        start = len(launched)
        calls()
        return launched[start:]

    monkeypatch.setattr(profiling, "device_events", device_events)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def function(*kernels: tuple[str, float]):
        return lambda: launched.extend(Event(name, Span(us)) for name, us in kernels)

    return function


def test_back_to_back_calls_sum_every_kernel(launches):
    timed = profiling.kernel_time(launches(("step", 3.0), ("copy", 1.0)), iters=4)
    assert (timed.us, timed.kernels) == (4.0, 2.0)


def test_the_flush_before_each_call_is_left_out(launches):
    flush = profiling.between(launches(("flush", 200.0)))
    assert (flush.names, flush.per_call) == (frozenset({"flush"}), 1)
    timed = profiling.kernel_time(launches(("step", 3.0)), iters=4, before=flush)
    assert (timed.us, timed.kernels) == (3.0, 1.0)


def test_a_call_that_launches_a_kernel_named_as_the_flushs_is_refused(launches):
    flush = profiling.between(launches(("fill", 200.0)))
    with pytest.raises(ValueError, match="launches kernels named as the flush's"):
        profiling.kernel_time(launches(("step", 3.0), ("fill", 1.0)), iters=4, before=flush)
