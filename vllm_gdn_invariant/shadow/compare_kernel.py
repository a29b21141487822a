"""The field statistics of compare.py in one pass over served and reference (CUDA).

For float32 and bfloat16 tensors, one Triton program per block of ``BLOCK`` elements reads the
raw bits ``a`` (served) and ``b`` (reference) once and reduces its block to nine integers and
one float:

* elements whose bits differ (``a != b``; +0 and -0 differ);
* the largest ULP distance of ``shadow/bits.py``'s ``ulp_distance``: ordered magnitudes
  (``-(bits & magnitude_mask)`` for a set sign bit), 0 when both are NaN, int64 max when one
  is;
* NaN mismatches (exactly one side NaN);
* six counts ``distance <= upper`` for ``bits.ULP_BUCKET_UPPER``;
* the largest ``|a - b|`` in float64 over pairs where both are finite (0 without any).

Reductions are ``tl.reduce`` with this module's combine functions (integer adds, maxima). The
host side sums the counts and takes the maxima over the programs' rows (exact in any order)
and turns the six counts into the seven buckets of ``bits.ULP_BUCKETS``.
``tests/shadow/test_compare_kernel.py`` pins the result to ``bits.compare`` (Triton's
interpreter on CPU tensors) and ``tests/gpu/test_shadow_compare_gpu.py`` to compare.py's torch
path on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from vllm_gdn_invariant.shadow.bits import ULP_BUCKET_UPPER, buckets_from_bounds, raw_bits

BLOCK = 4096
COUNTS = 9  # differing, max distance, NaN mismatches, six counts of distance <= upper
FUSED_DTYPES = (torch.float32, torch.bfloat16)
INT64_MAX = torch.iinfo(torch.int64).max


@triton.jit
def add(a, b):
    return a + b


@triton.jit
def larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def count(mask):
    """How many lanes of a boolean block are set (int64)."""
    return tl.reduce(mask.to(tl.int64), 0, add)


@triton.jit
def widened(bits, WIDTH: tl.constexpr):
    """(magnitude int64, sign set, float64 value) of raw bits of width 16 (bfloat16) or 32."""
    if WIDTH == 32:
        magnitude = (bits & 0x7FFFFFFF).to(tl.int64)
        value = bits.to(tl.float32, bitcast=True).to(tl.float64)
    else:
        wide = bits.to(tl.int32)
        magnitude = (wide & 0x7FFF).to(tl.int64)
        value = ((wide & 0xFFFF) << 16).to(tl.float32, bitcast=True).to(tl.float64)
    return magnitude, bits < 0, value


@triton.jit
def field_stats_kernel(
    a_ptr,
    b_ptr,
    n,
    ints_ptr,
    diffs_ptr,
    EXPONENT: tl.constexpr,
    WIDTH: tl.constexpr,
    U0: tl.constexpr,
    U1: tl.constexpr,
    U2: tl.constexpr,
    U3: tl.constexpr,
    U4: tl.constexpr,
    U5: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    a = tl.load(a_ptr + offsets, mask=inside, other=0)
    b = tl.load(b_ptr + offsets, mask=inside, other=0)
    magnitude_a, negative_a, value_a = widened(a, WIDTH)
    magnitude_b, negative_b, value_b = widened(b, WIDTH)
    nan_a = magnitude_a > EXPONENT
    nan_b = magnitude_b > EXPONENT
    ordered_a = tl.where(negative_a, -magnitude_a, magnitude_a)
    ordered_b = tl.where(negative_b, -magnitude_b, magnitude_b)
    distance = tl.abs(ordered_a - ordered_b)
    distance = tl.where(nan_a & nan_b, 0, distance)
    distance = tl.where(nan_a ^ nan_b, 9223372036854775807, distance)
    distance = tl.where(inside, distance, 0)
    finite = (magnitude_a < EXPONENT) & (magnitude_b < EXPONENT) & inside
    diff = tl.where(finite, tl.abs(value_a - value_b), 0.0)
    row = ints_ptr + pid.to(tl.int64) * 9
    tl.store(row + 0, count((a != b) & inside))
    tl.store(row + 1, tl.reduce(distance, 0, larger))
    tl.store(row + 2, count((nan_a ^ nan_b) & inside))
    tl.store(row + 3, count((distance <= U0) & inside))
    tl.store(row + 4, count((distance <= U1) & inside))
    tl.store(row + 5, count((distance <= U2) & inside))
    tl.store(row + 6, count((distance <= U3) & inside))
    tl.store(row + 7, count((distance <= U4) & inside))
    tl.store(row + 8, count((distance <= U5) & inside))
    tl.store(diffs_ptr + pid, tl.reduce(diff, 0, larger))


def fused_applies(served: Tensor, reference: Tensor) -> bool:
    """Whether :func:`field_stats` takes this pair (same float32/bfloat16 dtype and shape, at
    least one element)."""
    return (
        served.dtype in FUSED_DTYPES
        and served.dtype == reference.dtype
        and served.shape == reference.shape
        and served.numel() > 0
    )


def kernel_arguments(
    served: Tensor, reference: Tensor, ints: Tensor, diffs: Tensor
) -> tuple[tuple, dict[str, int]]:
    """``field_stats_kernel``'s positional arguments and constexprs for one field."""
    width = 8 * served.element_size()
    arguments = (
        raw_bits(served).reshape(-1),
        raw_bits(reference).reshape(-1),
        served.numel(),
        ints,
        diffs,
    )
    bounds = {f"U{i}": upper for i, upper in enumerate(ULP_BUCKET_UPPER)}
    exponent = 0x7F800000 if width == 32 else 0x7F80
    return arguments, {"EXPONENT": exponent, "WIDTH": width, **bounds, "BLOCK": BLOCK}


def field_stats(served: Tensor, reference: Tensor) -> tuple[Tensor, Tensor]:
    """compare.py's ``(int64 [3 + buckets], float64 [1])`` for one field, in one pass."""
    if not fused_applies(served, reference):
        raise ValueError(
            f"field_stats takes two float32 or bfloat16 tensors of one shape, got "
            f"{served.dtype}{tuple(served.shape)} and {reference.dtype}{tuple(reference.shape)}"
        )
    n = served.numel()
    programs = triton.cdiv(n, BLOCK)
    ints = torch.empty((programs, COUNTS), dtype=torch.int64, device=served.device)
    diffs = torch.empty(programs, dtype=torch.float64, device=served.device)
    arguments, constexprs = kernel_arguments(served, reference, ints, diffs)
    field_stats_kernel[(programs,)](*arguments, **constexprs)
    histogram = buckets_from_bounds(ints[:, 3:].sum(dim=0), n)
    head = torch.stack([ints[:, 0].sum(), ints[:, 1].max(), ints[:, 2].sum()])
    return torch.cat([head, histogram]), diffs.max().reshape(1)
