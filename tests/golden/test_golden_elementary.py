"""fp32 elementary functions (elementary.py): accuracy, special values, gradients, invariance."""

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import Tensor

from vllm_gdn_invariant.golden import elementary, exp, log1p, sigmoid, silu, softplus, sqrt
from vllm_gdn_invariant.golden.elementary import exp_forward
from vllm_gdn_invariant.shadow.bits import same_bits

FLT_TRUE_MIN = 2.0**-149


def ulp_error(y: Tensor, reference: Tensor) -> Tensor:
    """|y - reference| in units of the fp32 ULP at the float64 reference (subnormal ULP below)."""
    _, exponent = torch.frexp(reference.abs())
    ulp_exponent = torch.clamp(exponent.to(torch.int64) - 1, min=-126) - 23
    ulp = torch.ldexp(torch.ones_like(reference), ulp_exponent)
    error = (y.to(torch.float64) - reference).abs() / ulp
    overflows = torch.isinf(reference.to(torch.float32))
    matches_overflow = y.to(torch.float64) == reference.to(torch.float32).to(torch.float64)
    return torch.where(overflows, torch.where(matches_overflow, 0.0, math.inf), error)


def every_float(lo: float, hi: float) -> Tensor:
    """Every fp32 value in [lo, hi]; lo and hi must have the same sign."""
    assert (lo >= 0) == (hi > 0)
    ends = torch.tensor([lo, hi], dtype=torch.float32).view(torch.int32).tolist()
    start, stop = min(ends), max(ends)
    return torch.arange(start, stop + 1, dtype=torch.int32).view(torch.float32)


def dense(lo: float, hi: float, n: int = 1 << 22) -> Tensor:
    return torch.linspace(lo, hi, n, dtype=torch.float64).to(torch.float32)


def log_spaced(lo: float, hi: float, n: int = 1 << 21) -> Tensor:
    return torch.logspace(math.log10(lo), math.log10(hi), n, dtype=torch.float64).to(torch.float32)


@dataclass(frozen=True)
class Sweep:
    function: Callable[[Tensor], Tensor]
    reference: Callable[[Tensor], Tensor]  # float64
    points: Callable[[], list[Tensor]]
    bound: float  # regression bound in ULPs


def float64_silu(x: Tensor) -> Tensor:
    return torch.where(torch.isneginf(x), -0.0, x * torch.sigmoid(x))


SWEEPS = {
    # Regression bounds; measured max beside each (this sweep, torch 2.13 CPU).
    "exp": Sweep(
        exp,
        torch.exp,
        lambda: [
            dense(-104.0, 89.0),
            every_float(0.34, 0.35),  # reduction boundary +ln(2)/2
            every_float(-0.35, -0.34),
            every_float(88.6, 88.73),  # overflow
            every_float(-87.5, -87.2),  # results become subnormal
            every_float(-103.6, -103.0),  # smallest subnormals, then 0
            every_float(1e-4, 1.01e-4),
            every_float(10.0, 10.05),
        ],
        bound=1.0,  # measured 0.949
    ),
    "log1p": Sweep(
        log1p,
        torch.log1p,
        lambda: [
            dense(-0.9999, 10.0),
            log_spaced(1e-30, 5e8),
            -log_spaced(1e-30, 0.9999),
            every_float(0.41, 0.415),  # m switches at u = sqrt(2)
            every_float(-0.2935, -0.2925),  # and at u = sqrt(2)/2
            every_float(1.82, 1.84),  # correction switches at k = 2
            every_float(-1.0, -0.9999),
            every_float(1e-3, 1.002e-3),
            every_float(16776000.0, 16778000.0),  # 1 + x rounds
            every_float(4.85e8 - 1e4, 4.85e8 + 1e4),  # log1p(exp(20))
        ],
        bound=1.0,  # measured 0.863
    ),
    "sigmoid": Sweep(
        sigmoid,
        torch.sigmoid,
        lambda: [
            dense(-110.0, 110.0),
            every_float(-87.6, -87.1),  # results become subnormal
            every_float(-103.9, -103.2),  # smallest subnormals, then 0
            every_float(-1.01e-3, -1e-3),
            every_float(0.5, 0.51),
            every_float(-3.5, -3.4),
            every_float(15.0, 15.1),
            every_float(-16.7, -16.6),
        ],
        bound=2.5,  # measured 2.400
    ),
    "softplus": Sweep(
        softplus,
        torch.nn.functional.softplus,
        lambda: [
            dense(-104.0, 20.0),
            every_float(19.9, 20.5),  # threshold
            every_float(-87.5, -87.2),
            every_float(-0.51, -0.5),
            every_float(0.5, 0.51),
            every_float(-1.31, -1.3),
            every_float(14.0, 14.05),
        ],
        bound=2.0,  # measured 1.597
    ),
    "silu": Sweep(
        silu,
        float64_silu,
        lambda: [
            dense(-88.7, 89.0),
            every_float(-88.7, -88.0),
            every_float(-0.51, -0.5),
            every_float(0.5, 0.51),
            every_float(-16.7, -16.6),
            every_float(1e-3, 1.001e-3),
        ],
        bound=2.5,  # measured 2.403
    ),
}


def max_ulp_error(sweep: Sweep) -> tuple[float, float, int]:
    """(max ULP error, argument where it occurs, number of points) over the sweep."""
    worst, where, count = 0.0, math.nan, 0
    for x in sweep.points():
        error = ulp_error(sweep.function(x), sweep.reference(x.to(torch.float64)))
        i = int(error.argmax())
        if float(error[i]) > worst:
            worst, where = float(error[i]), float(x[i])
        count += x.numel()
    return worst, where, count


@pytest.mark.parametrize("name", list(SWEEPS))
def test_max_ulp_error_against_float64_stays_within_regression_bound(name):
    worst, where, count = max_ulp_error(SWEEPS[name])
    assert count > 4_000_000
    assert worst <= SWEEPS[name].bound, f"{name}: {worst:.3f} ULP at x={where!r}"


def test_ulp_error_measure_sees_one_ulp():
    x = torch.tensor([1.0, 3.0, 1e-40], dtype=torch.float32)
    y = torch.nextafter(x, torch.full_like(x, math.inf))
    assert ulp_error(y, x.to(torch.float64)).tolist() == [1.0, 1.0, 1.0]


def fp32(values) -> Tensor:
    return torch.tensor(values, dtype=torch.float32)


def correctly_rounded(reference: Tensor) -> Tensor:
    return reference.to(torch.float32)


INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(
    "function, x, expected",
    [
        (exp, [0.0, -0.0, INF, -INF, -104.0, -1e30, 1e30], [1.0, 1.0, INF, 0.0, 0.0, 0.0, INF]),
        (log1p, [0.0, INF, -1.0], [0.0, INF, -INF]),
        (sigmoid, [0.0, -0.0, INF, -INF, 20.0, -105.0], [0.5, 0.5, 1.0, 0.0, 1.0, 0.0]),
        (softplus, [INF, -INF, 20.5, 1e4], [INF, 0.0, 20.5, 1e4]),
        (silu, [0.0, INF, -90.0, 1e4], [0.0, INF, -0.0, 1e4]),
    ],
    ids=["exp", "log1p", "sigmoid", "softplus", "silu"],
)
def test_special_values(function, x, expected):
    assert same_bits(function(fp32(x)), fp32(expected))


def test_sqrt_is_the_correctly_rounded_square_root():
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.rand(1 << 20, generator=g) * 1e3,
            every_float(1.0, 1.125),  # every fp32 value of one eighth of a binade
            every_float(1e-45, 1e-39),  # subnormals
            fp32([0.0, -0.0, INF, 3.4e38, 1e-6]),
        ]
    )
    ieee = torch.from_numpy(np.sqrt(x.numpy()))  # numpy's float32 sqrt is the IEEE operation
    assert same_bits(sqrt(x), ieee)
    assert torch.isnan(sqrt(fp32([-1.0, -1e-45, -INF]))).all()


@pytest.mark.parametrize("function", [exp, log1p, sqrt, sigmoid, softplus, silu])
def test_nan_argument_comes_back_with_its_own_bits(function):
    # Arithmetic on NaN gives device-specific NaN bits (x86 keeps payload and sign, CUDA
    # returns a canonical NaN), so the functions return the argument itself.
    patterns = [0x7FC00000, -0x00400000, 0x7F800001, 0x7FC12345, -0x0000ABCD]  # int32 bits
    x = torch.tensor(patterns, dtype=torch.int32).view(torch.float32)
    assert torch.isnan(x).all()
    assert same_bits(function(x), x)


def test_log1p_keeps_negative_zero_and_tiny_arguments_and_rejects_below_minus_one():
    assert same_bits(log1p(fp32([-0.0])), fp32([-0.0]))
    tiny = fp32([1e-40, -1e-40, FLT_TRUE_MIN, 1e-30])
    assert same_bits(log1p(tiny), tiny)
    assert torch.isnan(log1p(fp32([-1.0000001, -2.0, -INF]))).all()


def test_silu_of_minus_infinity_is_its_limit_not_a_nan():
    # The formula gives -inf / inf, a NaN whose bits differ between CPU and CUDA.
    assert same_bits(silu(fp32([-INF])), fp32([-0.0]))


def test_exp_overflows_exactly_where_the_rounded_result_exceeds_fp32():
    last_finite = fp32([88.72283172607422])
    first_overflow = torch.nextafter(last_finite, fp32([INF]))
    assert torch.isfinite(exp(last_finite)).all()
    assert torch.isinf(exp(first_overflow)).all()
    assert torch.isinf(correctly_rounded(torch.exp(first_overflow.double()))).all()


@pytest.mark.parametrize("function, reference", [(exp, torch.exp), (sigmoid, torch.sigmoid)])
def test_subnormal_results_are_within_one_subnormal_step(function, reference):
    x = fp32([-87.5, -95.0, -100.0, -103.0, -103.2])
    y = function(x)
    ref = reference(x.double())
    assert (y > 0).all() and (y < 2.0**-126).all()
    assert ((y.double() - ref).abs() <= FLT_TRUE_MIN).all()


@pytest.mark.parametrize("x", [1e4, 100.0, 30.0, 20.5])
def test_softplus_gradient_is_finite_and_one_for_large_x(x):
    t = fp32([x]).requires_grad_()
    softplus(t).sum().backward()
    assert torch.isfinite(t.grad).all()
    assert t.grad.item() == 1.0


@pytest.mark.parametrize(
    "function, derivative",
    [
        (exp, torch.exp),
        (log1p, lambda x: 1.0 / (1.0 + x)),
        (sqrt, lambda x: 0.5 / torch.sqrt(x)),
        (sigmoid, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x))),
        (softplus, torch.sigmoid),
        (silu, lambda x: torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x)))),
    ],
    ids=["exp", "log1p", "sqrt", "sigmoid", "softplus", "silu"],
)
def test_backward_matches_the_float64_derivative(function, derivative):
    low = 0.01 if function is sqrt else -0.9
    x = torch.linspace(low, 15.0, 2001, dtype=torch.float32).requires_grad_()
    grad_out = torch.linspace(0.5, 1.5, 2001, dtype=torch.float32)
    function(x).backward(grad_out)
    expected = derivative(x.detach().double()) * grad_out.double()
    relative = ((x.grad.double() - expected).abs() / expected.abs().clamp(min=1e-30)).max()
    assert relative < 1e-6  # regression bound; measured max 2.9e-7 (sigmoid)


@pytest.mark.parametrize("function", [exp, log1p, sqrt, sigmoid, softplus, silu])
def test_bits_do_not_depend_on_tensor_size_shape_or_strides(function):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1 << 16, generator=g) * 120.0 - 60.0
    if function in (log1p, sqrt):
        x = x.abs()
    y = function(x)
    for start, stop in [(0, 1), (5, 6), (7, 1000), (1 << 15, (1 << 16) - 3)]:
        assert same_bits(function(x[start:stop]), y[start:stop])
    assert same_bits(function(x[3::7]), y[3::7])
    assert same_bits(function(x.reshape(256, 256).t()), y.reshape(256, 256).t())
    assert same_bits(function(x[17].reshape(())), y[17].reshape(()))


@pytest.mark.parametrize("function", [exp, log1p, sqrt, sigmoid, softplus, silu])
def test_non_fp32_input_is_rejected(function):
    with pytest.raises(TypeError, match="float32"):
        function(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32"):
        function(torch.zeros(3, dtype=torch.bfloat16))


def module_float_constants() -> dict[str, float]:
    found = {}
    for name, value in vars(elementary).items():
        if name.isupper() and isinstance(value, float):
            found[name] = value
        elif name.isupper() and isinstance(value, tuple):
            found.update({f"{name}[{i}]": v for i, v in enumerate(value)})
    return found


def test_every_constant_is_an_exact_fp32_value():
    constants = module_float_constants()
    assert {"LOG2E", "LN2_HI", "LN2_LO", "EXP_POLY[5]", "LOG_POLY[3]"} <= set(constants)
    for name, value in constants.items():
        assert float(np.float32(value)) == value, name


def test_cody_waite_head_times_any_reachable_n_is_exact():
    n = np.arange(-150, 130, dtype=np.float64)
    products = n * elementary.LN2_HI
    assert np.array_equal(products.astype(np.float32).astype(np.float64), products)


def test_softplus_never_computes_inf_on_the_untaken_branch(monkeypatch):
    produced_inf = []

    def recording_exp(x):
        y = exp_forward(x)
        produced_inf.append(bool(torch.isinf(y).any()))
        return y

    monkeypatch.setattr(elementary, "exp_forward", recording_exp)
    y = elementary.softplus_forward(fp32([1e4, 100.0, 89.0, 20.5, 3.0]))
    assert produced_inf == [False]
    assert same_bits(y, fp32([1e4, 100.0, 89.0, 20.5, float(softplus(fp32([3.0])))]))
