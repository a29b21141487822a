"""The field statistics of compare.py in one pass over served and reference rows (CUDA).

For float32 and bfloat16 fields of ``m`` rows (``E`` elements each): reference row ``i`` is
``reference[i]``, served row ``i`` is ``served[rows[i]]`` (the live cache or output, read in
place: no gathered copy) or ``served[i]``, and rows whose ``valid[i]`` is 0 are left out. The
grid is ``(m, SPLIT)``: program ``(i, s)`` reads blocks ``s, s + SPLIT, ...`` of row ``i`` (raw
bits, once), keeps per-lane counts and maxima in 32-bit integers, reduces them at the end and
adds (or takes the maximum) into the field's row of compare.py's layout (int64
``[STATS_WIDTH]``, zeros before the launch):

0. elements whose bits differ (``a != b``; +0 and -0 differ);
1. the largest ULP distance of ``shadow/bits.py``'s ``ulp_distance`` over pairs without a
   NaN mismatch (``|ma - mb|`` for magnitudes of one sign, ``ma + mb`` across signs, which
   fits 32 unsigned bits; 0 when both are NaN); the host makes it int64 max when item 2 > 0;
2. NaN mismatches (exactly one side NaN);
3. to 8. six counts ``distance <= upper`` for ``bits.ULP_BUCKET_UPPER`` (a NaN mismatch is
   in none);
9. the largest ``|a - b|`` in float64 over pairs where both are finite (0 without any), as its
   bits: for values >= 0 the int64 order of the bits is the order of the values;
10. rows compared (valid rows).

Counts are integer atomic adds and the maxima integer atomic maxima, exact in any order, so
the row does not depend on how the programs are scheduled. Only core ``triton.language``
builtins and this module's ``@triton.jit`` helpers are called (``tl.reduce`` with ``add`` and
``larger``), so Triton's interpreter runs the kernel as written.
``tests/shadow/test_compare_kernel.py`` pins the result to ``bits.compare`` (Triton's
interpreter on CPU tensors) and
``tests/gpu/test_shadow_compare_gpu.py`` to compare.py's torch path on CUDA.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from vllm_gdn_invariant.shadow.bits import ULP_BUCKET_UPPER, raw_bits

BLOCK = 1024
PROGRAMS = 1024  # about this many programs per field: a few per SM, few atomics
STATS_WIDTH = 11  # see the module docstring
FUSED_DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def add(a, b):
    return a + b


@triton.jit
def larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def magnitude_sign_value(bits, WIDTH: tl.constexpr):
    """(magnitude int32, sign set, float64 value) of raw bits of width 16 (bfloat16) or 32."""
    if WIDTH == 32:
        magnitude = bits & 0x7FFFFFFF
        value = bits.to(tl.float32, bitcast=True).to(tl.float64)
        negative = bits < 0
    else:
        wide = bits.to(tl.int32) & 0xFFFF
        magnitude = wide & 0x7FFF
        value = (wide << 16).to(tl.float32, bitcast=True).to(tl.float64)
        negative = wide > 0x7FFF
    return magnitude, negative, value


@triton.jit
def rows_stats_kernel(
    a_ptr,
    a_rows_ptr,
    a_row_stride,
    b_ptr,
    valid_ptr,
    row_elements,
    out_ptr,
    EXPONENT: tl.constexpr,
    WIDTH: tl.constexpr,
    U0: tl.constexpr,
    U1: tl.constexpr,
    U2: tl.constexpr,
    U3: tl.constexpr,
    U4: tl.constexpr,
    U5: tl.constexpr,
    INDEXED: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One field: grid ``(m, SPLIT)``."""
    row_stats(
        a_ptr,
        a_rows_ptr,
        a_row_stride,
        b_ptr,
        valid_ptr,
        row_elements,
        out_ptr,
        tl.program_id(0),
        tl.program_id(1),
        EXPONENT,
        WIDTH,
        U0,
        U1,
        U2,
        U3,
        U4,
        U5,
        INDEXED,
        SPLIT,
        BLOCK,
    )


@triton.jit
def three_fields_stats_kernel(
    a0_ptr,
    a0_rows_ptr,
    a0_row_stride,
    b0_ptr,
    row_elements0,
    a1_ptr,
    a1_rows_ptr,
    a1_row_stride,
    b1_ptr,
    row_elements1,
    a2_ptr,
    a2_rows_ptr,
    a2_row_stride,
    b2_ptr,
    row_elements2,
    valid_ptr,
    out_ptr,
    EXPONENT0: tl.constexpr,
    WIDTH0: tl.constexpr,
    INDEXED0: tl.constexpr,
    SPLIT0: tl.constexpr,
    EXPONENT1: tl.constexpr,
    WIDTH1: tl.constexpr,
    INDEXED1: tl.constexpr,
    SPLIT1: tl.constexpr,
    EXPONENT2: tl.constexpr,
    WIDTH2: tl.constexpr,
    INDEXED2: tl.constexpr,
    SPLIT2: tl.constexpr,
    U0: tl.constexpr,
    U1: tl.constexpr,
    U2: tl.constexpr,
    U3: tl.constexpr,
    U4: tl.constexpr,
    U5: tl.constexpr,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Three fields of the same rows in one launch: grid ``(m, max SPLIT, 3)``, field ``f``
    into row ``f`` of ``out`` (``ROW`` = ``STATS_WIDTH`` values each); a field's programs
    beyond its ``SPLIT`` do nothing."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    field = tl.program_id(2)
    if field == 0:
        if part < SPLIT0:
            row_stats(
                a0_ptr,
                a0_rows_ptr,
                a0_row_stride,
                b0_ptr,
                valid_ptr,
                row_elements0,
                out_ptr,
                row,
                part,
                EXPONENT0,
                WIDTH0,
                U0,
                U1,
                U2,
                U3,
                U4,
                U5,
                INDEXED0,
                SPLIT0,
                BLOCK,
            )
    elif field == 1:
        if part < SPLIT1:
            row_stats(
                a1_ptr,
                a1_rows_ptr,
                a1_row_stride,
                b1_ptr,
                valid_ptr,
                row_elements1,
                out_ptr + ROW,
                row,
                part,
                EXPONENT1,
                WIDTH1,
                U0,
                U1,
                U2,
                U3,
                U4,
                U5,
                INDEXED1,
                SPLIT1,
                BLOCK,
            )
    else:
        if part < SPLIT2:
            row_stats(
                a2_ptr,
                a2_rows_ptr,
                a2_row_stride,
                b2_ptr,
                valid_ptr,
                row_elements2,
                out_ptr + 2 * ROW,
                row,
                part,
                EXPONENT2,
                WIDTH2,
                U0,
                U1,
                U2,
                U3,
                U4,
                U5,
                INDEXED2,
                SPLIT2,
                BLOCK,
            )


@triton.jit
def row_stats(
    a_ptr,
    a_rows_ptr,
    a_row_stride,
    b_ptr,
    valid_ptr,
    row_elements,
    out_ptr,
    row,
    part,
    EXPONENT: tl.constexpr,
    WIDTH: tl.constexpr,
    U0: tl.constexpr,
    U1: tl.constexpr,
    U2: tl.constexpr,
    U3: tl.constexpr,
    U4: tl.constexpr,
    U5: tl.constexpr,
    INDEXED: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``(row, part)`` of one field: adds into ``out_ptr[0:STATS_WIDTH]``."""
    valid = tl.load(valid_ptr + row).to(tl.int32) != 0
    limit = tl.where(valid, row_elements, 0)  # an invalid row reads nothing
    if INDEXED:
        a_row = tl.load(a_rows_ptr + row).to(tl.int64)
    else:
        a_row = row.to(tl.int64)
    a_base = a_ptr + a_row * a_row_stride
    b_base = b_ptr + row.to(tl.int64) * row_elements
    lanes = tl.arange(0, BLOCK)
    differing = tl.full((BLOCK,), 0, tl.int32)
    nan_mismatches = tl.full((BLOCK,), 0, tl.int32)
    at_most_0 = tl.full((BLOCK,), 0, tl.int32)
    at_most_1 = tl.full((BLOCK,), 0, tl.int32)
    at_most_2 = tl.full((BLOCK,), 0, tl.int32)
    at_most_3 = tl.full((BLOCK,), 0, tl.int32)
    at_most_4 = tl.full((BLOCK,), 0, tl.int32)
    at_most_5 = tl.full((BLOCK,), 0, tl.int32)
    largest = tl.full((BLOCK,), 0, tl.uint32)
    largest_diff = tl.full((BLOCK,), 0, tl.float64)
    for start in range(part * BLOCK, row_elements, SPLIT * BLOCK):
        offsets = start + lanes
        inside = offsets < limit
        a = tl.load(a_base + offsets, mask=inside, other=0)
        b = tl.load(b_base + offsets, mask=inside, other=0)
        magnitude_a, negative_a, value_a = magnitude_sign_value(a, WIDTH)
        magnitude_b, negative_b, value_b = magnitude_sign_value(b, WIDTH)
        nan_a = magnitude_a > EXPONENT
        nan_b = magnitude_b > EXPONENT
        ua = magnitude_a.to(tl.uint32)
        ub = magnitude_b.to(tl.uint32)
        distance = tl.where(
            negative_a == negative_b, tl.maximum(ua, ub) - tl.minimum(ua, ub), ua + ub
        )
        distance = tl.where(nan_a & nan_b, 0, distance)
        one_nan = (nan_a ^ nan_b) & inside
        counted = inside & ~one_nan
        distance = tl.where(counted, distance, 0)
        differing += ((a != b) & inside).to(tl.int32)
        nan_mismatches += one_nan.to(tl.int32)
        at_most_0 += ((distance <= U0) & counted).to(tl.int32)
        at_most_1 += ((distance <= U1) & counted).to(tl.int32)
        at_most_2 += ((distance <= U2) & counted).to(tl.int32)
        at_most_3 += ((distance <= U3) & counted).to(tl.int32)
        at_most_4 += ((distance <= U4) & counted).to(tl.int32)
        at_most_5 += ((distance <= U5) & counted).to(tl.int32)
        largest = tl.maximum(largest, distance)
        finite = (magnitude_a < EXPONENT) & (magnitude_b < EXPONENT) & inside
        largest_diff = tl.maximum(largest_diff, tl.where(finite, tl.abs(value_a - value_b), 0.0))
    tl.atomic_add(out_ptr + 0, tl.reduce(differing.to(tl.int64), 0, add))
    tl.atomic_max(out_ptr + 1, tl.reduce(largest, 0, larger).to(tl.int64))
    tl.atomic_add(out_ptr + 2, tl.reduce(nan_mismatches.to(tl.int64), 0, add))
    tl.atomic_add(out_ptr + 3, tl.reduce(at_most_0.to(tl.int64), 0, add))
    tl.atomic_add(out_ptr + 4, tl.reduce(at_most_1.to(tl.int64), 0, add))
    tl.atomic_add(out_ptr + 5, tl.reduce(at_most_2.to(tl.int64), 0, add))
    tl.atomic_add(out_ptr + 6, tl.reduce(at_most_3.to(tl.int64), 0, add))
    tl.atomic_add(out_ptr + 7, tl.reduce(at_most_4.to(tl.int64), 0, add))
    tl.atomic_add(out_ptr + 8, tl.reduce(at_most_5.to(tl.int64), 0, add))
    tl.atomic_max(out_ptr + 9, tl.reduce(largest_diff, 0, larger).to(tl.int64, bitcast=True))
    if part == 0:
        tl.atomic_add(out_ptr + 10, valid.to(tl.int64))


def row_elements(t: Tensor) -> int:
    return math.prod(t.shape[1:])


def rows_readable(served: Tensor) -> bool:
    """Whether each row of ``served`` is one contiguous run of elements (any row stride)."""
    return served.dim() >= 2 and served.size(0) > 0 and served[0:1].is_contiguous()


def fused_applies(served: Tensor, reference: Tensor, rows: Tensor | None = None) -> bool:
    """Whether :func:`field_stats` takes this field: float32 or bfloat16 on both sides, rows of
    one shape, each served row contiguous, a contiguous reference, at least one element."""
    m = reference.size(0) if reference.dim() else 0
    return (
        served.dtype in FUSED_DTYPES
        and served.dtype == reference.dtype
        and served.shape[1:] == reference.shape[1:]
        and (rows is not None or served.shape[0] == m)
        and (rows is None or rows.numel() == m)
        and reference.is_contiguous()
        and rows_readable(served)
        and served.stride(-1) == 1
        and reference.numel() > 0
    )


def split_of(num_rows: int, elements: int) -> int:
    """Programs per row: about ``PROGRAMS`` in all, at most one per block of a row."""
    return max(1, min(triton.cdiv(elements, BLOCK), PROGRAMS // max(num_rows, 1)))


def kernel_arguments(
    served: Tensor,
    reference: Tensor,
    out: Tensor,
    rows: Tensor | None,
    valid: Tensor,
) -> tuple[tuple, dict[str, int]]:
    """``rows_stats_kernel``'s positional arguments and constexprs for one field."""
    width = 8 * served.element_size()
    elements = row_elements(reference)
    arguments = (
        served.view(torch.int32 if width == 32 else torch.int16),
        rows if rows is not None else valid,
        served.stride(0),
        raw_bits(reference),
        valid,
        elements,
        out,
    )
    bounds = {f"U{i}": upper for i, upper in enumerate(ULP_BUCKET_UPPER)}
    return arguments, {
        "EXPONENT": 0x7F800000 if width == 32 else 0x7F80,
        "WIDTH": width,
        **bounds,
        "INDEXED": rows is not None,
        "SPLIT": split_of(reference.size(0), elements),
        "BLOCK": BLOCK,
    }


def row_mask(valid: Tensor | None, m: int, device: torch.device) -> Tensor:
    """The kernels' row mask: ``valid`` as int8 (a bool mask viewed), or all rows."""
    if valid is None:
        return torch.ones(m, dtype=torch.int8, device=device)
    return valid.view(torch.int8) if valid.dtype == torch.bool else valid


def field_stats(
    served: Tensor,
    reference: Tensor,
    out: Tensor,
    rows: Tensor | None = None,
    valid: Tensor | None = None,
) -> None:
    """Add one field's statistics into ``out`` (int64 ``[STATS_WIDTH]``, zeros), one pass.

    ``rows`` (int64 ``[m]``): served row ``i`` is ``served[rows[i]]`` (else ``served[i]``);
    ``valid`` (bool or integer ``[m]``): rows to compare (else all)."""
    if served.dim() == 1 and rows is None and valid is None:
        served, reference = served.view(1, -1), reference.view(1, -1)
    if not fused_applies(served, reference, rows):
        raise ValueError(
            "field_stats takes float32 or bfloat16 rows of one shape (contiguous rows), got "
            f"{served.dtype}{tuple(served.shape)} and {reference.dtype}{tuple(reference.shape)}"
        )
    if out.dtype != torch.int64 or out.shape != (STATS_WIDTH,) or out.device != served.device:
        raise ValueError(f"out must be int64 [{STATS_WIDTH}] on {served.device}")
    m = reference.size(0)
    valid = row_mask(valid, m, served.device)
    arguments, constexprs = kernel_arguments(served, reference, out, rows, valid)
    grid = (m, constexprs["SPLIT"])
    rows_stats_kernel[grid](*arguments, **constexprs)


def three_fields_apply(pairs: list[tuple[Tensor, Tensor, Tensor | None]]) -> bool:
    """Whether :func:`three_fields_stats` takes ``(served, reference, rows)`` x 3."""
    return len(pairs) == 3 and all(fused_applies(*pair) for pair in pairs)


def three_fields_arguments(
    pairs: list[tuple[Tensor, Tensor, Tensor | None]], out: Tensor, valid: Tensor
) -> tuple[tuple[int, int, int], tuple, dict[str, int]]:
    """(grid, positional arguments, constexprs) of ``three_fields_stats_kernel``."""
    arguments: list = []
    constexprs: dict[str, int] = {}
    for f, (served, reference, rows) in enumerate(pairs):
        (a, a_rows, stride, b, _, elements, _), one = kernel_arguments(
            served, reference, out, rows, valid
        )
        arguments += [a, a_rows, stride, b, elements]
        for name in ("EXPONENT", "WIDTH", "INDEXED", "SPLIT"):
            constexprs[f"{name}{f}"] = one[name]
    bounds = {f"U{i}": upper for i, upper in enumerate(ULP_BUCKET_UPPER)}
    constexprs |= bounds | {"ROW": STATS_WIDTH, "BLOCK": BLOCK}
    split = max(constexprs[f"SPLIT{f}"] for f in range(3))
    return (pairs[0][1].size(0), split, 3), (*arguments, valid, out), constexprs


def three_fields_stats(
    pairs: list[tuple[Tensor, Tensor, Tensor | None]], out: Tensor, valid: Tensor | None = None
) -> None:
    """:func:`field_stats` of three fields of the same ``m`` rows, ``(served, reference,
    rows)`` each, into rows 0, 1, 2 of ``out`` (int64 ``[3, STATS_WIDTH]``, zeros), one
    launch."""
    if not three_fields_apply(pairs):
        raise ValueError("three_fields_stats takes three fields that field_stats takes")
    m = pairs[0][1].size(0)
    if any(reference.size(0) != m for _, reference, _ in pairs):
        raise ValueError("the three fields must have the same rows")
    if out.dtype != torch.int64 or out.shape != (3, STATS_WIDTH) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int64 [3, {STATS_WIDTH}]")
    valid = row_mask(valid, m, out.device)
    grid, arguments, constexprs = three_fields_arguments(pairs, out, valid)
    three_fields_stats_kernel[grid](*arguments, **constexprs)
