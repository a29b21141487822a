"""The field statistics of compare.py in one pass over served and reference (CUDA).

For float32 and bfloat16 tensors, one Triton program per block of ``BLOCK`` elements reads the
raw bits ``a`` (served) and ``b`` (reference) once, reduces its block and adds (or takes the
maximum) into the field's row of compare.py's layout (int64 ``[STATS_WIDTH]``):

0. elements whose bits differ (``a != b``; +0 and -0 differ);
1. the largest ULP distance of ``shadow/bits.py``'s ``ulp_distance``: ordered magnitudes
   (``-(bits & magnitude_mask)`` for a set sign bit), 0 when both are NaN, int64 max when one
   is;
2. NaN mismatches (exactly one side NaN);
3. to 8. six counts ``distance <= upper`` for ``bits.ULP_BUCKET_UPPER``;
9. the largest ``|a - b|`` in float64 over pairs where both are finite (0 without any), as its
   bits: for values >= 0 the int64 order of the bits is the order of the values.

Counts are integer atomic adds and the maxima integer atomic maxima, exact in any order, so
the row does not depend on how the programs are scheduled; the row must hold zeros before the
launch. ``tests/shadow/test_compare_kernel.py`` pins the result to ``bits.compare`` (Triton's
interpreter on CPU tensors) and ``tests/gpu/test_shadow_compare_gpu.py`` to compare.py's torch
path on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from vllm_gdn_invariant.shadow.bits import ULP_BUCKET_UPPER, raw_bits

BLOCK = 4096
STATS_WIDTH = 10  # differing, max ULP, NaN mismatches, six counts distance <= upper, max |diff|
FUSED_DTYPES = (torch.float32, torch.bfloat16)


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
    out_ptr,
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
    tl.atomic_add(out_ptr + 0, count((a != b) & inside))
    tl.atomic_max(out_ptr + 1, tl.reduce(distance, 0, larger))
    tl.atomic_add(out_ptr + 2, count((nan_a ^ nan_b) & inside))
    tl.atomic_add(out_ptr + 3, count((distance <= U0) & inside))
    tl.atomic_add(out_ptr + 4, count((distance <= U1) & inside))
    tl.atomic_add(out_ptr + 5, count((distance <= U2) & inside))
    tl.atomic_add(out_ptr + 6, count((distance <= U3) & inside))
    tl.atomic_add(out_ptr + 7, count((distance <= U4) & inside))
    tl.atomic_add(out_ptr + 8, count((distance <= U5) & inside))
    tl.atomic_max(out_ptr + 9, tl.reduce(diff, 0, larger).to(tl.int64, bitcast=True))


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
    served: Tensor, reference: Tensor, out: Tensor
) -> tuple[tuple, dict[str, int]]:
    """``field_stats_kernel``'s positional arguments and constexprs for one field."""
    width = 8 * served.element_size()
    arguments = (raw_bits(served).reshape(-1), raw_bits(reference).reshape(-1), served.numel(), out)
    bounds = {f"U{i}": upper for i, upper in enumerate(ULP_BUCKET_UPPER)}
    exponent = 0x7F800000 if width == 32 else 0x7F80
    return arguments, {"EXPONENT": exponent, "WIDTH": width, **bounds, "BLOCK": BLOCK}


def field_stats(served: Tensor, reference: Tensor, out: Tensor) -> None:
    """Add one field's statistics into ``out`` (int64 ``[STATS_WIDTH]``, zeros), one pass."""
    if not fused_applies(served, reference):
        raise ValueError(
            f"field_stats takes two float32 or bfloat16 tensors of one shape, got "
            f"{served.dtype}{tuple(served.shape)} and {reference.dtype}{tuple(reference.shape)}"
        )
    if out.dtype != torch.int64 or out.shape != (STATS_WIDTH,) or out.device != served.device:
        raise ValueError(f"out must be int64 [{STATS_WIDTH}] on {served.device}")
    programs = triton.cdiv(served.numel(), BLOCK)
    arguments, constexprs = kernel_arguments(served, reference, out)
    field_stats_kernel[(programs,)](*arguments, **constexprs)
