"""Triton device functions with the goldens' arithmetic: elementary functions, the fixed-order
sum, and exact conversions between fp32 and bf16 / fp16.

The spec is the docstring of ``vllm_gdn_invariant.golden.elementary`` (exp, log1p, sigmoid,
softplus, silu, sqrt) and of ``vllm_gdn_invariant.golden.reduction`` (``fixed_order_sum``); the
constants are the golden's own values, read from that module. Each function here performs the
golden's IEEE operations in the golden's order, one Triton op per tensor op of the golden:

* ``+ - *`` on fp32 tensors, compiled with FP contraction off (every launch passes
  ``enable_fp_fusion=False``), so no multiply and add are fused into an FMA;
* division is ``tl.div_rn`` and the square root ``tl.sqrt_rn`` (IEEE round to nearest; Triton's
  ``/`` and ``tl.sqrt`` are approximate on NVIDIA GPUs);
* ``torch.round`` (half to even) is ``(t + 1.5 * 2^23) - 1.5 * 2^23``, exact for the |t| <= 151
  it sees; ``floor(n * 0.5)`` of an integer-valued ``n`` is the arithmetic shift ``n >> 1``;
* negation is ``x * -1.0`` (a sign flip, -0 for +0 like ``torch.neg``);
* no ``tl.exp``/``tl.log``/``tl.sigmoid``/``tl.sqrt``/``tl.sum``/``tl.fma``, and ``tl.reduce``
  only over axes of one or two elements (a copy, or one add).

``fixed_order_sum_slabs`` writes the golden's pairwise order as explicit adds of two halves,
level by level (its docstring says how the halves are formed). ``tl.sum`` is not used: its
order is Triton's, and under ``TRITON_INTERPRET=1`` it sums through numpy, which turns
``-0 + -0`` into ``+0``.

Conversions round to nearest even, torch's rounding. Compiled, they are Triton's casts
(``cvt.rn``; widening is exact). Under the interpreter, whose bf16 casts are wrong (widening
flushes bf16 subnormals, narrowing does not round to nearest even), bf16 is converted on the bits
(``BF16_ON_BITS``): widening is a 16-bit shift, narrowing adds 0x7FFF plus the lowest kept bit
(NaN becomes 0x7FC0 as in torch on CPU; the GPU's cvt gives 0x7FFF, as torch does on CUDA).
fp16 uses Triton's casts in both (numpy's in the interpreter, which round to nearest even).
"""

import triton
import triton.language as tl

from vllm_gdn_invariant.golden import elementary as spec
from vllm_gdn_invariant.golden.recurrent import QK_NORM_EPS as _QK_NORM_EPS

LOG2E = tl.constexpr(spec.LOG2E)
LN2_HI = tl.constexpr(spec.LN2_HI)
LN2_LO = tl.constexpr(spec.LN2_LO)
EXP_MIN_ARG = tl.constexpr(spec.EXP_MIN_ARG)
EXP_MAX_ARG = tl.constexpr(spec.EXP_MAX_ARG)
EXP_P0 = tl.constexpr(spec.EXP_POLY[0])
EXP_P1 = tl.constexpr(spec.EXP_POLY[1])
EXP_P2 = tl.constexpr(spec.EXP_POLY[2])
EXP_P3 = tl.constexpr(spec.EXP_POLY[3])
EXP_P4 = tl.constexpr(spec.EXP_POLY[4])
EXP_P5 = tl.constexpr(spec.EXP_POLY[5])
LOG_P0 = tl.constexpr(spec.LOG_POLY[0])
LOG_P1 = tl.constexpr(spec.LOG_POLY[1])
LOG_P2 = tl.constexpr(spec.LOG_POLY[2])
LOG_P3 = tl.constexpr(spec.LOG_POLY[3])
SOFTPLUS_THRESHOLD = tl.constexpr(spec.SOFTPLUS_THRESHOLD)
ONE_BITS = tl.constexpr(spec.ONE_BITS)
SQRT_HALF_BITS = tl.constexpr(spec.SQRT_HALF_BITS)
MANTISSA_MASK = tl.constexpr(spec.MANTISSA_MASK)
EXPONENT_BIAS = tl.constexpr(spec.EXPONENT_BIAS)
MANTISSA_BITS = tl.constexpr(spec.MANTISSA_BITS)
QK_NORM_EPS = tl.constexpr(_QK_NORM_EPS)
ROUND_SHIFTER = tl.constexpr(12582912.0)  # 1.5 * 2^23: t + it rounds t to an integer (|t| < 2^22)
BF16_NAN_BITS = tl.constexpr(0x7FC0)  # torch's bf16 NaN on CPU (c10::BFloat16)
# -0.0 from its bits: Triton 3.6's interpreter turns a -0.0 literal into +0.0.
NEGATIVE_ZERO_BITS = tl.constexpr(-(1 << 31))


@triton.jit
def neg(x):
    """-x as a sign flip (-0 for +0)."""
    return x * -1.0


@triton.jit
def pow2(k):
    """2^k for int32 ``k`` in [-126, 127], from exponent bits (exact)."""
    return ((k + EXPONENT_BIAS) << MANTISSA_BITS).to(tl.float32, bitcast=True)


@triton.jit
def exp(x):
    """golden.elementary.exp_forward: clamp, Cody-Waite reduction, Horner, exact 2^n scaling."""
    is_nan = x != x
    xc = tl.where(is_nan, 0.0, x)
    xc = tl.where(xc < EXP_MIN_ARG, EXP_MIN_ARG, xc)
    xc = tl.where(xc > EXP_MAX_ARG, EXP_MAX_ARG, xc)
    t = xc * LOG2E
    n = (t + ROUND_SHIFTER) - ROUND_SHIFTER  # torch.round: half to even
    r = xc - n * LN2_HI
    r = r - n * LN2_LO
    p = r * EXP_P5  # horner(r, EXP_POLY): acc = c5, acc = acc * r, acc = acc + c4, ...
    p = p + EXP_P4
    p = p * r
    p = p + EXP_P3
    p = p * r
    p = p + EXP_P2
    p = p * r
    p = p + EXP_P1
    p = p * r
    p = p + EXP_P0
    y = p * (r * r)
    y = y + r
    y = y + 1.0
    ni = n.to(tl.int32)
    n_half = ni >> 1  # floor(n * 0.5)
    y = y * pow2(n_half)
    y = y * pow2(ni - n_half)
    return tl.where(is_nan, x, y)


@triton.jit
def log1p(x):
    """golden.elementary.log1p_forward: 1 + x split into 2^k * m, its rounding error recovered."""
    in_domain = (x > -1.0) & (x < float("inf"))
    xs = tl.where(in_domain, x, 0.0)
    u = xs + 1.0
    bits = u.to(tl.int32, bitcast=True) + (ONE_BITS - SQRT_HALF_BITS)
    k = (bits >> MANTISSA_BITS) - EXPONENT_BIAS
    m = ((bits & MANTISSA_MASK) + SQRT_HALF_BITS).to(tl.float32, bitcast=True)
    kf = k.to(tl.float32)
    c_small = xs - (u - 1.0)
    c_large = 1.0 - (u - xs)
    c = tl.div_rn(tl.where(k >= 2, c_large, c_small), u)
    f = m - 1.0
    s = tl.div_rn(f, f + 2.0)
    z = s * s
    q = z * LOG_P3  # horner(z, LOG_POLY)
    q = q + LOG_P2
    q = q * z
    q = q + LOG_P1
    q = q * z
    q = q + LOG_P0
    r = z * q
    hfsq = (f * f) * 0.5
    y = s * (hfsq + r)
    y = y + (kf * LN2_LO + c)
    y = y - hfsq
    y = y + f
    y = y + kf * LN2_HI
    y = tl.where(x == 0.0, x, y)  # keeps the sign of zero
    y = tl.where(x == float("inf"), x, y)
    y = tl.where(x == -1.0, float("-inf"), y)
    return tl.where(x < -1.0, float("nan"), tl.where(x != x, x, y))


@triton.jit
def sigmoid(x):
    """golden.elementary.sigmoid_forward: e = exp(-|x|); 1 / (1 + e) if x >= 0, else e / (1 + e)."""
    e = exp(neg(tl.abs(x)))
    d = e + 1.0
    positive = tl.div_rn(1.0, d)
    negative = tl.div_rn(e, d)
    y = tl.where(x < 0.0, negative, positive)
    return tl.where(x != x, x, y)


@triton.jit
def softplus(x):
    """golden.elementary.softplus_forward: x above 20, else log1p(exp(x))."""
    taken = x > SOFTPLUS_THRESHOLD
    clamped = tl.where(taken, SOFTPLUS_THRESHOLD, x)
    return tl.where(taken, x, log1p(exp(clamped)))


@triton.jit
def silu(x):
    """golden.elementary.silu_forward: x / (1 + exp(-x)); -0 at -inf."""
    y = tl.div_rn(x, exp(neg(x)) + 1.0)
    negative_zero = tl.full(x.shape, NEGATIVE_ZERO_BITS, tl.int32).to(tl.float32, bitcast=True)
    y = tl.where(x == float("-inf"), negative_zero, y)
    return tl.where(x != x, x, y)


@triton.jit
def sqrt(x):
    """golden.elementary.sqrt_forward: the correctly rounded fp32 square root (NaN below 0)."""
    y = tl.where(x < 0.0, float("nan"), tl.sqrt_rn(x))
    return tl.where(x != x, x, y)


@triton.jit
def add(a, b):
    """a + b: the combine function of the two-element reductions below."""
    return a + b


@triton.jit
def halve_last(x, A: tl.constexpr, B: tl.constexpr, W: tl.constexpr):
    """[A, B, W] -> [A, B, W / 2]: x[..., :W/2] + x[..., W/2:], elementwise (W a power of two)."""
    pairs = tl.permute(tl.reshape(x, [A, B, 2, W // 2]), [0, 1, 3, 2])
    low, high = tl.split(pairs)
    return low + high


@triton.jit
def add_halves(slabs, LOG2_J: tl.constexpr):
    """One tensor from a tuple of J = 2^LOG2_J equal-shaped tensors, in the golden's order:
    level by level, slab j + slab j + J/2 (elementwise) for the first half of the slabs."""
    for level in tl.static_range(LOG2_J):
        pairs = ()
        for j in tl.static_range((1 << LOG2_J) >> (level + 1)):
            pairs = pairs + (slabs[j] + slabs[j + ((1 << LOG2_J) >> (level + 1))],)
        slabs = pairs
    return slabs[0]


@triton.jit
def fixed_order_sum_slabs(
    slabs,
    R: tl.constexpr,
    LOG2_J: tl.constexpr,
    LOG2_CL: tl.constexpr,
    LOG2_VEC: tl.constexpr,
):
    """golden.reduction.fixed_order_sum over k of a row block held as slabs -> [R].

    ``slabs`` is a tuple of J = 2^LOG2_J tensors [R, C], slab j holding k = j * C + c, with
    C = VEC * 2^LOG2_CL; the padded width is J * C and the caller has put zeros in the padding.
    Level by level the two halves of the remaining k range are added elementwise, as the golden
    does: first the J levels (slab j + slab j + J/2), then LOG2_CL levels over the high bits of
    c (a ``tl.reduce`` over an axis of two elements, which is one add), then the LOG2_VEC levels
    over its low bits (split and add). Each add has the golden's two operands; how the halves
    are brought together changes no bits.
    """
    VEC: tl.constexpr = 1 << LOG2_VEC
    C: tl.constexpr = VEC << LOG2_CL
    x = add_halves(slabs, LOG2_J)
    for level in tl.static_range(LOG2_CL):
        x = tl.reduce(tl.reshape(x, [R, 2, (C >> level) // 2]), 1, add)
    x = tl.reshape(x, [R, 1, VEC])
    for level in tl.static_range(LOG2_VEC):
        x = halve_last(x, R, 1, VEC >> level)
    return tl.reshape(x, [R])


@triton.jit
def bf16_bits_to_fp32(x):
    """Widen bf16 to fp32 (exact): the 16 bits shifted into the high half."""
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def fp32_to_bf16_bits(x):
    """Round fp32 to bf16, nearest even, on the bits (torch's CPU rounding; NaN -> 0x7FC0)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    rounded = tl.where(x != x, BF16_NAN_BITS, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


# Decorated like every function here: a compiled JITFunction, or an interpreted function when
# TRITON_INTERPRET=1 was set at import.
INTERPRETED = not isinstance(bf16_bits_to_fp32, triton.runtime.JITFunction)
BF16_ON_BITS = tl.constexpr(INTERPRETED)


@triton.jit
def to_fp32(x):
    """Widen a loaded fp32 / bf16 / fp16 tensor to fp32 (exact)."""
    if x.dtype == tl.bfloat16 and BF16_ON_BITS:
        return bf16_bits_to_fp32(x)
    else:
        return x.to(tl.float32)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """Round fp32 ``x`` to ``dtype`` (fp32, bf16 or fp16), nearest even."""
    if dtype == tl.bfloat16:
        if BF16_ON_BITS:
            return fp32_to_bf16_bits(x)
        else:
            return x.to(tl.bfloat16)
    elif dtype == tl.float16:
        return x.to(tl.float16)
    else:
        return x
