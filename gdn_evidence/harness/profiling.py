"""The device time of the kernels and copies that one call launches (torch.profiler), for the
GPU benchmarks (scripts/bench_decode.py, scripts/bench_mixed_step.py)."""

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


def kernel_time(fn: Callable[[], object], iters: int = PROFILE_ITERS) -> KernelTime:
    """The mean over ``iters`` profiled calls of ``fn`` (one warm-up call before, unprofiled)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return KernelTime(
        us=sum(e.time_range.elapsed_us() for e in events) / iters, kernels=len(events) / iters
    )
