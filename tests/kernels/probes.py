"""Probe kernels of the kernel tests, and deliberately wrong building blocks.

conftest.py imports this file with TRITON_INTERPRET=1 set, so every function here runs in
Triton's interpreter. The probes take the device function under test as a constexpr argument:
``apply_unary`` applies one elementwise, ``convert`` widens and rounds through a pair,
``sum_rows`` runs a fixed-order sum over the rows of a matrix. The variants below them are the
negative controls: a sum in another order, Triton's exp, an exp whose multiply-adds are fused,
and vLLM's SiLU. Nothing here calls one of triton.language's own ``@triton.jit`` functions
(``tl.zeros``, ``tl.sum``, ...): those were decorated when Triton was imported, compiled, and
cannot run inside interpreted code.
"""

import triton
import triton.language as tl

from vllm_gdn_invariant.golden import elementary as spec


@triton.jit
def apply_unary(x_ptr, y_ptr, n, FUNCTION: tl.constexpr, BLOCK: tl.constexpr):
    """y = FUNCTION(x), elementwise."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(y_ptr + offsets, FUNCTION(x), mask=mask)


@triton.jit
def convert(x_ptr, y_ptr, n, TO_FP32: tl.constexpr, ROUND_TO: tl.constexpr, BLOCK: tl.constexpr):
    """y = ROUND_TO(TO_FP32(x), y's dtype), elementwise."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = TO_FP32(tl.load(x_ptr + offsets, mask=mask, other=0.0))
    tl.store(y_ptr + offsets, ROUND_TO(x, y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sum_rows(
    x_ptr,
    y_ptr,
    K: tl.constexpr,
    R: tl.constexpr,
    SUM: tl.constexpr,
    LOG2_J: tl.constexpr,
    LOG2_CL: tl.constexpr,
    LOG2_VEC: tl.constexpr,
):
    """y[r] = SUM over the K elements of row r of x [R, K] (contiguous), zero padded."""
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    rows = tl.arange(0, R)[:, None]
    columns = tl.arange(0, C)[None, :]
    slabs = ()
    for j in tl.static_range(1 << LOG2_J):
        k = j * C + columns
        mask = (k < K) & (rows < R)
        slabs = slabs + (tl.load(x_ptr + rows * K + k, mask=mask, other=0.0),)
    tl.store(y_ptr + tl.arange(0, R), SUM(slabs, R, LOG2_J, LOG2_CL, LOG2_VEC))


# Negative controls


@triton.jit
def plus(a, b):
    return a + b


@triton.jit
def sequential_sum(slabs, R: tl.constexpr, LOG2_J: tl.constexpr, LOG2_CL, LOG2_VEC):
    """A sum in another order: slab after slab, then element after element along c."""
    total = slabs[0]
    for j in tl.static_range(1, 1 << LOG2_J):
        total = total + slabs[j]
    return tl.reduce(total, 1, plus)


@triton.jit
def hardware_exp(x):
    """Triton's exp (``ex2.approx`` on a GPU, numpy's exp in the interpreter)."""
    return tl.exp(x)


@triton.jit
def fused(x, y, z):
    """x * y + z rounded once (an FMA: the float64 product of two fp32 values is exact)."""
    return (x.to(tl.float64) * y.to(tl.float64) + z.to(tl.float64)).to(tl.float32)


@triton.jit
def contracted_exp(x):
    """The golden exp with its reduction and Horner multiply-adds fused, as a compiler with
    contraction on would do."""
    xc = tl.minimum(tl.maximum(x, spec.EXP_MIN_ARG), spec.EXP_MAX_ARG)
    n = (xc * spec.LOG2E + 12582912.0) - 12582912.0
    r = fused(n, tl.full(n.shape, -spec.LN2_HI, tl.float32), xc)
    r = fused(n, tl.full(n.shape, -spec.LN2_LO, tl.float32), r)
    p = tl.full(r.shape, spec.EXP_POLY[5], tl.float32)
    for i in tl.static_range(4, -1, -1):
        p = fused(p, r, tl.full(r.shape, spec.EXP_POLY[i], tl.float32))
    y = fused(p, r * r, r) + 1.0
    ni = n.to(tl.int32)
    half = ni >> 1
    y = y * ((half + 127) << 23).to(tl.float32, bitcast=True)
    return y * ((ni - half + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def approximate_silu(x):
    """vLLM's SiLU: x / (1 + exp(-x)) with Triton's exp and division."""
    return x / (1.0 + tl.exp(-x))
