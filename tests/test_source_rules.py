"""Two dead-code checks ruff does not make: a module-level name defined twice at the top level
(pyflakes' F811 misses a function redefined after a use, and a plain assignment repeated),
and a private module-level name (``_x``) its own module never uses (pyflakes does not look for
unused functions; a private name used elsewhere would break the house rule anyway)."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    path
    for folder in ("vllm_gdn_invariant", "gdn_evidence", "scripts", "tests")
    for path in sorted((ROOT / folder).rglob("*.py"))
]


def top_level_names(tree: ast.Module) -> list[tuple[str, int]]:
    """(name, line) of every def, class and plain assignment of the module body itself."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.Assign):
            found += [(t.id, node.lineno) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            if isinstance(node.target, ast.Name):
                found.append((node.target.id, node.lineno))
    return found


def redefined(source: str) -> list[str]:
    """``name (lines)`` of each top-level name defined more than once."""
    lines = collections.defaultdict(list)
    for name, line in top_level_names(ast.parse(source)):
        lines[name].append(line)
    return [f"{name} {at}" for name, at in lines.items() if len(at) > 1]


def unused_private(source: str) -> list[str]:
    """``name line`` of each top-level ``_name`` nothing in the module reads (by name, as an
    attribute or as a string such as ``__all__`` or ``getattr`` uses)."""
    tree = ast.parse(source)
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.add(node.value)
    return [
        f"{name} {line}"
        for name, line in top_level_names(tree)
        if name.startswith("_") and not name.startswith("__") and name not in used
    ]


def test_the_checks_see_a_repeated_block_and_an_unused_private_function():
    source = (
        "def _table(v):\n    return v\n\n"
        "TABLE: dict = {v: _table(v) for v in (1, 2)}\n\n"
        "def _table(v):\n    return v\n\n"
        "TABLE: dict = {v: _table(v) for v in (1, 2)}\n\n"
        "def _text(x):\n    return x or ''\n"
    )
    assert redefined(source) == ["_table [1, 6]", "TABLE [4, 9]"]
    assert unused_private(source) == ["_text 11"]
    assert redefined("A = 1\nB = A\n") == [] and unused_private("_a = 1\nb = _a\n") == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_level_name_is_defined_twice_or_private_and_unused(path):
    source = path.read_text(encoding="utf-8")
    assert redefined(source) == []
    assert unused_private(source) == []
