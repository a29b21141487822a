"""Source rules of the kernels: the goldens' constants, no library arithmetic in device code.

Inside every ``@triton.jit`` function of vllm_gdn_invariant/kernels: no ``/`` (Triton's division
is approximate; ``tl.div_rn`` is IEEE), no Triton function whose rounding or order is Triton's
(exp, log, sqrt, sigmoid, sum, fma, ...), ``tl.reduce`` only with the two-operand ``add``, and no
call of one of triton.language's own jit functions (they cannot run in interpreted code).
"""

import ast
from pathlib import Path

import pytest
import triton
import triton.language as tl

import vllm_gdn_invariant.kernels as kernels_package
from vllm_gdn_invariant.golden import elementary as golden_elementary
from vllm_gdn_invariant.golden.recurrent import QK_NORM_EPS
from vllm_gdn_invariant.kernels import elementary

SOURCES = sorted(Path(kernels_package.__file__).parent.glob("*.py"))
FORBIDDEN_TRITON = {
    "exp", "exp2", "log", "log2", "log1p", "sqrt", "rsqrt", "sigmoid", "softmax", "sum",
    "cumsum", "cumprod", "fma", "fdiv", "erf", "tanh", "sin", "cos", "pow", "dot", "dot_scaled",
    "floor", "ceil", "math", "extra", "inline_asm_elementwise", "xor_sum", "max", "min",
}  # fmt: skip


def jit_functions(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d).startswith("triton.jit") for d in node.decorator_list)
    ]


def violations(function: ast.FunctionDef) -> list[str]:
    found = []
    for node in ast.walk(function):
        where = f"{function.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found.append(f"{where} uses /")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "tl" and node.attr in FORBIDDEN_TRITON:
                found.append(f"{where} uses tl.{node.attr}")
            if node.value.id == "tl" and isinstance(
                getattr(tl, node.attr, None), triton.runtime.JITFunction
            ):
                found.append(f"{where} calls triton.language's jit function tl.{node.attr}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "tl.reduce":
            if ast.unparse(node.args[2]) != "add":
                found.append(f"{where} reduces with {ast.unparse(node.args[2])}")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_device_code_uses_only_the_goldens_arithmetic(path):
    assert [v for f in jit_functions(path) for v in violations(f)] == []


def test_every_kernel_module_has_device_code_checked():
    checked = {p.name for p in SOURCES if jit_functions(p)}
    assert checked == {"conv.py", "elementary.py", "recurrent.py", "replay.py"}


def test_constants_are_the_goldens():
    for name in ("LOG2E", "LN2_HI", "LN2_LO", "EXP_MIN_ARG", "EXP_MAX_ARG", "SOFTPLUS_THRESHOLD"):
        assert getattr(elementary, name).value == getattr(golden_elementary, name), name
    for name in ("ONE_BITS", "SQRT_HALF_BITS", "MANTISSA_MASK", "EXPONENT_BIAS", "MANTISSA_BITS"):
        assert getattr(elementary, name).value == getattr(golden_elementary, name), name
    assert elementary.QK_NORM_EPS.value == QK_NORM_EPS


@pytest.mark.parametrize("prefix, golden", [("EXP_P", "EXP_POLY"), ("LOG_P", "LOG_POLY")])
def test_polynomials_have_the_goldens_coefficients_and_degree(prefix, golden):
    coefficients = getattr(golden_elementary, golden)
    values = [getattr(elementary, f"{prefix}{i}").value for i in range(len(coefficients))]
    assert values == list(coefficients)
    assert not hasattr(elementary, f"{prefix}{len(coefficients)}")


def test_the_rules_catch_library_arithmetic():
    source = (
        "@triton.jit\ndef f(x, y):\n"
        "    z = tl.zeros([4], tl.float32)\n"
        "    return tl.reduce(tl.exp(x) / y + z, 0, tl.maximum)\n"
    )
    (function,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)]
    found = violations(function)
    assert len(found) == 4, found  # /, tl.exp, tl.zeros (a jit function), reduce with maximum
