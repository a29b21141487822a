"""The device time of the kernels and copies that one call launches (torch.profiler), for the
GPU benchmarks (scripts/bench_decode.py, scripts/bench_mixed_step.py): calls back to back, or
each after another function (an L2 flush) whose kernels are left out of the sum."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

PROFILE_ITERS = 20


@dataclass(frozen=True)
class KernelTime:
    """Per call: device time of the launched kernels and copies, and how many were launched."""

    us: float
    kernels: float


def device_events(calls: Callable[[], object]) -> list:
    """The CUDA kernels and copies that ``calls`` launches, profiled to its end."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        calls()
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA]


def kernel_time(
    fn: Callable[[], object],
    iters: int = PROFILE_ITERS,
    between: Callable[[], object] | None = None,
) -> KernelTime:
    """The mean over ``iters`` profiled calls of ``fn`` (one warm-up call before, unprofiled).

    With ``between``, each call follows a call of ``between`` and only the kernels and copies
    named as one call of ``fn`` launches them are counted; ValueError if ``between`` launches a
    kernel of such a name (its time could not be told from ``fn``'s)."""
    fn()
    torch.cuda.synchronize()
    if between is None:
        events = device_events(lambda: [fn() for _ in range(iters)])
    else:
        names = {e.name for e in device_events(fn)}
        shared = names & {e.name for e in device_events(between)}
        if shared:
            raise ValueError(f"the function between the calls launches their kernels {shared}")
        events = [
            e
            for e in device_events(lambda: [(between(), fn()) for _ in range(iters)])
            if e.name in names
        ]
    return KernelTime(
        us=sum(e.time_range.elapsed_us() for e in events) / iters, kernels=len(events) / iters
    )
