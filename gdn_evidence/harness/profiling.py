"""The device time of the kernels and copies that one call launches (torch.profiler), for the
GPU benchmarks (scripts/bench_decode.py, scripts/bench_mixed_step.py): calls back to back, or
each after another function (an L2 flush, ``between``) whose kernels are left out of the sum."""

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


@dataclass(frozen=True)
class Between:
    """A function run before each profiled call (an L2 flush) and the names of the kernels and
    copies one call of it launches (``between``), which the sum leaves out."""

    fn: Callable[[], object]
    names: frozenset[str]
    per_call: int


def between(fn: Callable[[], object]) -> Between:
    """``fn`` as a Between, its kernels read off one profiled call."""
    fn()
    torch.cuda.synchronize()
    events = device_events(fn)
    return Between(fn, frozenset(e.name for e in events), len(events))


def kernel_time(
    fn: Callable[[], object], iters: int = PROFILE_ITERS, before: Between | None = None
) -> KernelTime:
    """The mean over ``iters`` profiled calls of ``fn`` (one warm-up call before, unprofiled).

    With ``before``, each call follows a call of ``before.fn`` and the kernels of its names are
    left out; ValueError if more of them ran than ``before.fn`` launches (``fn`` launches a
    kernel of such a name, whose time could not be told from the flush's)."""
    fn()
    torch.cuda.synchronize()
    if before is None:
        events = device_events(lambda: [fn() for _ in range(iters)])
    else:
        events = device_events(lambda: [(before.fn(), fn()) for _ in range(iters)])
        skipped = sum(e.name in before.names for e in events)
        if skipped != iters * before.per_call:
            raise ValueError(
                f"the measured function launches kernels named as the flush's {set(before.names)}"
            )
        events = [e for e in events if e.name not in before.names]
    return KernelTime(
        us=sum(e.time_range.elapsed_us() for e in events) / iters, kernels=len(events) / iters
    )
