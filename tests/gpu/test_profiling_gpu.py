"""The benchmarks' device-time profiler with a function between the calls (an L2 flush): only
the measured call's kernels are counted, and a function that launches one of them is refused."""

from __future__ import annotations

import pytest
import torch

from gdn_evidence.harness.profiling import between, kernel_time

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_the_kernels_between_the_calls_are_left_out():
    src = torch.ones(1 << 18, dtype=torch.float32, device="cuda")  # 1 MiB
    dst = torch.empty_like(src)
    flush = torch.zeros(64 << 20, dtype=torch.int32, device="cuda")  # 256 MiB

    def copy() -> None:
        dst.copy_(src)

    flushed = kernel_time(flush.bitwise_not_, 5)
    cold = kernel_time(copy, 5, before=between(flush.bitwise_not_))
    assert cold.kernels == 1  # the copy alone, per call
    assert cold.us < flushed.us / 4  # the flush (about 0.2 ms on an H100) is not in it


def test_a_read_between_the_calls_is_left_out_too():
    """bench_decode.py's ``--flush read``: the buffer summed, its reduction not counted."""
    src = torch.ones(1 << 18, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    flush = torch.zeros(64 << 20, dtype=torch.int32, device="cuda")  # 256 MiB

    def read() -> None:
        flush.sum(dtype=torch.int64)

    flushed = kernel_time(read, 5)
    cold = kernel_time(lambda: dst.copy_(src), 5, before=between(read))
    assert cold.kernels == 1
    assert cold.us < flushed.us / 4


def test_a_function_between_the_calls_that_launches_their_kernels_is_refused():
    src = torch.ones(1 << 18, dtype=torch.float32, device="cuda")
    dst, other = torch.empty_like(src), torch.empty_like(src)
    with pytest.raises(ValueError, match="launches kernels named as the flush's"):
        kernel_time(lambda: dst.copy_(src), 5, before=between(lambda: other.copy_(src)))
