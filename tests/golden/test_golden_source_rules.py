"""Source rules of the golden package: only fixed-order arithmetic, imports at the top."""

import ast
from pathlib import Path

import pytest

import vllm_gdn_invariant.golden as golden

PACKAGE = Path(golden.__file__).parent
SOURCES = sorted(PACKAGE.glob("*.py"))

# Ops whose rounding or reduction order is the library's or the device's, not ours.
FORBIDDEN_ATTRIBUTES = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sigmoid", "softplus", "silu",
    "tanh", "pow", "float_power", "ldexp", "frexp", "sum", "nansum", "mean", "norm",
    "cumsum", "cumprod", "prod", "matmul", "mm", "bmm", "einsum", "dot", "addmm", "addcmul",
    "addcdiv", "baddbmm", "logsumexp", "linalg", "special", "functional", "conv1d", "lerp",
}  # fmt: skip


def forbidden_uses(path: Path) -> list[str]:
    """Forbidden ops in a source file; torch.sqrt only in elementary.py (its float64 sqrt)."""
    forbidden = FORBIDDEN_ATTRIBUTES | ({"sqrt"} if path.name != "elementary.py" else set())
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in forbidden:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult | ast.Pow):
            found.append(f"{path.name}:{node.lineno} {type(node.op).__name__}")
    return found


def local_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_rules_see_the_package_sources():
    assert {p.name for p in SOURCES} >= {
        "elementary.py",
        "reduction.py",
        "recurrent.py",
        "conv.py",
        "contract.py",
    }


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_library_transcendental_or_reduction_is_used(path):
    assert forbidden_uses(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_function_local_imports(path):
    assert local_imports(path) == []


def test_the_rule_catches_a_library_sum(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\n\ndef f(x):\n    import math\n    return torch.sum(x) @ torch.sqrt(x)\n"
    )
    assert sorted(forbidden_uses(sample)) == [
        "sample.py:5 .sqrt",
        "sample.py:5 .sum",
        "sample.py:5 MatMult",
    ]
    assert local_imports(sample) == ["sample.py:4"]
