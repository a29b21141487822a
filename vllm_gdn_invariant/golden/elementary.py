"""fp32 elementary functions built from a fixed sequence of IEEE operations.

exp, log1p, sigmoid, softplus and silu use only elementwise ``+ - * /``, comparisons,
``torch.where``, ``torch.round`` (half to even), ``torch.floor``, ``abs`` and int32 bit
operations on ``Tensor.view(torch.int32)``. Each of these is correctly rounded IEEE arithmetic
on CPU and CUDA, and each is its own tensor op, so no multiply-add is ever contracted into an
FMA. Their results are therefore the same bits on any device, for any tensor shape, stride or
batch size. No ``torch.exp``/``log``/``log1p``/``sigmoid``/``pow``/``ldexp`` is used. Divisions
are always tensor by tensor: PyTorch's CUDA kernel turns a division by a Python scalar into a
multiplication by its reciprocal, and its CPU kernel does not. A NaN argument is returned as it
is (its own bits), and no other argument produces a NaN by arithmetic, because such a NaN is
not the same bit pattern on CPU and CUDA.

``torch.sqrt`` on fp32 CPU tensors is not correctly rounded (measured with torch 2.13 on an
AVX512 CPU: 708,053 of 4,194,304 random inputs differ from the IEEE square root), while CUDA's
is. ``sqrt`` here is therefore the float64 square root rounded to fp32, which is the correctly
rounded fp32 square root on both: a float's square root is never closer than 2^-51 (relative)
to an fp32 rounding midpoint, so even a float64 root that is off by an ULP (2^-52) rounds
correctly.

exp(x)
    Arguments are clamped to [-104, 89] (exp(-104) rounds to 0 and exp(89) overflows, so the
    clamp changes no result). ``n = round(x * log2(e))``; Cody-Waite reduction with a 16-bit
    head of ln 2, ``r = (x - n * LN2_HI) - n * LN2_LO`` (the first product and difference are
    exact); ``exp(r) = 1 + (r + r^2 * P(r))`` with ``P`` of degree 5 in Horner form;
    scaling by ``2^n`` as two exact multiplications by ``2^floor(n/2)`` and ``2^(n - floor(n/2))``
    built from exponent bits, so subnormal results are rounded once and overflow gives inf.
log1p(x)
    ``u = 1 + x``; ``u = 2^k * m`` with ``m`` in [sqrt(2)/2, sqrt(2)) from the bits of ``u``;
    the rounding error of ``u`` is recovered as ``c = (x - (u - 1)) / u`` (as
    ``(1 - (u - x)) / u`` for ``k >= 2``); with ``f = m - 1``, ``s = f / (2 + f)``, ``z = s^2`` and
    ``R = z * Q(z)`` (``Q`` of degree 3):
    ``log1p(x) = ((((s * (f^2/2 + R)) + (k * LN2_LO + c)) - f^2/2) + f) + k * LN2_HI``.
sigmoid(x)
    ``e = exp(-|x|)``; ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` for x < 0.
softplus(x)
    ``x`` for ``x > 20``, else ``log1p(exp(x))`` (the argument of the untaken branch is clamped
    to 20, so it never computes inf).
silu(x)
    ``x / (1 + exp(-x))``. For x < -88.72, ``exp(-x)`` is inf and the result is -0 (the true
    value there is below 3e-37 in magnitude); silu(-inf) is -0, its limit, where the formula
    would give inf / inf.

Measured accuracy: max error in fp32 ULPs of the float64 value (``|y - ref| / ulp(ref)``), over
the sweep of tests/golden/test_golden_elementary.py (4.2M evenly spaced points over the range,
for log1p also 2M log-spaced points on each side of 0, plus every fp32 value in narrow ranges
around the hard spots; 4.7M to 8.8M points per function):

=========  ======================  ========
function   range                   max ULP
=========  ======================  ========
exp        [-104, 89]              0.949
log1p      [-0.9999, 5e8]          0.863
sigmoid    [-110, 110]             2.400
softplus   [-104, 20]              1.597
silu       [-88.7, 89]             2.403
=========  ======================  ========

Over every fp32 value (tests/gpu/test_golden_device_bitwise.py on an H200; the CUDA bits equal
the CPU bits), the distance from the float64 value rounded to fp32 is at most 1 ULP for exp
and log1p and 2 ULPs for sigmoid, softplus and silu (silu above -88.72).

The results assume subnormals are not flushed (the default of torch on CPU and CUDA; under
``torch.set_flush_denormal(True)`` subnormal results become 0).

Every function has a ``torch.autograd.Function`` with an analytic backward, computed with these
same functions: exp' = exp(x), log1p' = 1 / (1 + x), sqrt' = 1 / (2 sqrt(x)), sigmoid' = s(1 - s),
softplus' = 1 for x > 20 else sigmoid(x), silu' = s(1 + x(1 - s)), with s = sigmoid(x) and
1 - s evaluated as sigmoid(-x) (no cancellation for large x).
"""

import torch
from torch import Tensor

# Constants are exact fp32 values, written as hex.
LOG2E = float.fromhex("0x1.715476p+0")  # fp32(log2(e))
LN2_HI = float.fromhex("0x1.62e4p-1")  # ln 2 to 16 bits: n * LN2_HI is exact for |n| < 256
LN2_LO = float.fromhex("0x1.7f7d1cp-20")  # fp32(ln 2 - LN2_HI)
EXP_MIN_ARG = -104.0
EXP_MAX_ARG = 89.0
# exp(r) = 1 + r + r^2 * P(r) on |r| <= ln(2)/2; coefficients of P from r^0 up.
EXP_POLY = (
    float.fromhex("0x1.000000p-1"),
    float.fromhex("0x1.555554p-3"),
    float.fromhex("0x1.55548ep-5"),
    float.fromhex("0x1.111270p-7"),
    float.fromhex("0x1.6d8d06p-10"),
    float.fromhex("0x1.9f08b4p-13"),
)
# log((1 + s) / (1 - s)) = 2s + s * z * Q(z), z = s^2, |s| <= 0.1716; coefficients of Q from z^0 up.
LOG_POLY = (
    float.fromhex("0x1.555554p-1"),
    float.fromhex("0x1.999a7ap-2"),
    float.fromhex("0x1.2438cap-2"),
    float.fromhex("0x1.e2f8a6p-3"),
)
SOFTPLUS_THRESHOLD = 20.0
ONE_BITS = 0x3F800000  # bits of 1.0f
SQRT_HALF_BITS = 0x3F3504F3  # bits of fp32(sqrt(2)/2)
MANTISSA_MASK = 0x007FFFFF
EXPONENT_BIAS = 127
MANTISSA_BITS = 23


def require_fp32(x: Tensor, name: str) -> None:
    """Raise TypeError unless ``x`` is an fp32 tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name} expects a float32 tensor, got {x.dtype}")


def horner(x: Tensor, coefficients: tuple[float, ...]) -> Tensor:
    """c0 + x * (c1 + x * (c2 + ...)), one tensor op per multiply and per add."""
    acc = torch.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = acc * x
        acc = acc + c
    return acc


def pow2(k: Tensor) -> Tensor:
    """2^k for integer-valued fp32 ``k`` in [-126, 127], built from exponent bits (exact)."""
    biased = k.to(torch.int32) + EXPONENT_BIAS
    return torch.bitwise_left_shift(biased, MANTISSA_BITS).view(torch.float32)


def exp_forward(x: Tensor) -> Tensor:
    """exp(x) in fp32, no autograd (see the module docstring for the sequence)."""
    is_nan = torch.isnan(x)
    xc = torch.where(is_nan, 0.0, x)
    xc = torch.where(xc < EXP_MIN_ARG, EXP_MIN_ARG, xc)
    xc = torch.where(xc > EXP_MAX_ARG, EXP_MAX_ARG, xc)
    n = torch.round(xc * LOG2E)
    r = xc - n * LN2_HI
    r = r - n * LN2_LO
    p = horner(r, EXP_POLY)
    y = p * (r * r)
    y = y + r
    y = y + 1.0
    n_half = torch.floor(n * 0.5)
    y = y * pow2(n_half)
    y = y * pow2(n - n_half)
    return torch.where(is_nan, x, y)


def log1p_forward(x: Tensor) -> Tensor:
    """log(1 + x) in fp32, no autograd (see the module docstring for the sequence)."""
    in_domain = (x > -1.0) & (x < float("inf"))
    xs = torch.where(in_domain, x, 0.0)
    u = xs + 1.0
    bits = u.view(torch.int32) + (ONE_BITS - SQRT_HALF_BITS)
    k = torch.bitwise_right_shift(bits, MANTISSA_BITS) - EXPONENT_BIAS
    m = (torch.bitwise_and(bits, MANTISSA_MASK) + SQRT_HALF_BITS).view(torch.float32)
    kf = k.to(torch.float32)
    c_small = xs - (u - 1.0)
    c_large = 1.0 - (u - xs)
    c = torch.where(k >= 2, c_large, c_small) / u
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    r = z * horner(z, LOG_POLY)
    hfsq = (f * f) * 0.5
    y = s * (hfsq + r)
    y = y + (kf * LN2_LO + c)
    y = y - hfsq
    y = y + f
    y = y + kf * LN2_HI
    y = torch.where(x == 0.0, x, y)  # keeps the sign of zero
    y = torch.where(x == float("inf"), x, y)
    y = torch.where(x == -1.0, float("-inf"), y)
    return torch.where(x < -1.0, float("nan"), torch.where(torch.isnan(x), x, y))


def sqrt_forward(x: Tensor) -> Tensor:
    """The correctly rounded fp32 square root, no autograd (NaN for x < 0)."""
    y = torch.sqrt(x.to(torch.float64)).to(torch.float32)
    y = torch.where(x < 0.0, float("nan"), y)
    return torch.where(torch.isnan(x), x, y)


def sigmoid_forward(x: Tensor) -> Tensor:
    """1 / (1 + exp(-x)) in fp32, no autograd."""
    e = exp_forward(-torch.abs(x))
    d = e + 1.0
    positive = torch.ones_like(d) / d
    negative = e / d
    y = torch.where(x < 0.0, negative, positive)
    return torch.where(torch.isnan(x), x, y)


def softplus_forward(x: Tensor) -> Tensor:
    """log(1 + exp(x)) for x <= 20, x above, in fp32, no autograd."""
    taken = x > SOFTPLUS_THRESHOLD
    clamped = torch.where(taken, SOFTPLUS_THRESHOLD, x)
    return torch.where(taken, x, log1p_forward(exp_forward(clamped)))


def silu_forward(x: Tensor) -> Tensor:
    """x / (1 + exp(-x)) in fp32, no autograd; -0 at -inf (the limit, not inf / inf)."""
    y = x / (exp_forward(-x) + 1.0)
    y = torch.where(x == float("-inf"), -0.0, y)
    return torch.where(torch.isnan(x), x, y)


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = exp_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return grad * y


class Log1p(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return log1p_forward(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad / (x + 1.0)


class Sqrt(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = sqrt_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return grad / (y + y)


class Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        s = sigmoid_forward(x)
        ctx.save_for_backward(x, s)
        return s

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        x, s = ctx.saved_tensors
        return grad * (s * sigmoid_forward(-x))


class Softplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return softplus_forward(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        slope = torch.where(x > SOFTPLUS_THRESHOLD, 1.0, sigmoid_forward(x))
        return grad * slope


class Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return silu_forward(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        s = sigmoid_forward(x)
        return grad * (s * (x * sigmoid_forward(-x) + 1.0))


def exp(x: Tensor) -> Tensor:
    """exp(x) for an fp32 tensor: Cody-Waite reduction, degree-5 polynomial, exact 2^n scaling.

    Same bits on every device; differs from ``tl.exp`` (``ex2.approx`` based) and from
    ``torch.exp`` (platform libm / SLEEF), either of which may differ by an ULP or more.
    """
    require_fp32(x, "exp")
    return Exp.apply(x)


def log1p(x: Tensor) -> Tensor:
    """log(1 + x) for an fp32 tensor, with the rounding error of 1 + x recovered.

    Differs from vLLM's softplus, which computes ``tl.log(1.0 + tl.exp(x))`` and so loses the
    low bits of 1 + exp(x) that this function keeps.
    """
    require_fp32(x, "log1p")
    return Log1p.apply(x)


def sqrt(x: Tensor) -> Tensor:
    """The correctly rounded square root of an fp32 tensor (IEEE ``sqrt``), on CPU and CUDA alike.

    Triton's default ``tl.sqrt`` is an approximation; ``tl.sqrt_rn`` gives these bits.
    """
    require_fp32(x, "sqrt")
    return Sqrt.apply(x)


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + exp(-x)) for an fp32 tensor, evaluated as e / (1 + e) with e = exp(-|x|) below 0.

    Accurate over the whole fp32 line (subnormal results included); ``tl.sigmoid`` uses the
    hardware's approximate exp and division.
    """
    require_fp32(x, "sigmoid")
    return Sigmoid.apply(x)


def softplus(x: Tensor) -> Tensor:
    """softplus with vLLM's threshold: x for x > 20, else log1p(exp(x)); finite gradient.

    vLLM's kernels compute ``log(1 + exp(x))`` with Triton's exp and log for x <= 20.
    """
    require_fp32(x, "softplus")
    return Softplus.apply(x)


def silu(x: Tensor) -> Tensor:
    """x / (1 + exp(-x)) for an fp32 tensor, with IEEE division and this module's exp.

    The same expression as vLLM's conv kernel, which Triton lowers to ``ex2.approx`` and the
    approximate ``div.full.f32``.
    """
    require_fp32(x, "silu")
    return Silu.apply(x)
