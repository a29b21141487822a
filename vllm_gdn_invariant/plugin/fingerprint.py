"""Source fingerprints of vLLM functions.

A fingerprint is the first 16 hex digits of the SHA-256 of a function's source text, as
written in its module file: from ``def`` to its last line, dedented, trailing whitespace
removed. Decorators are not part of it. The same function computes it from an installed
module and from a file read out of a wheel, so both sides agree by construction.
"""

from __future__ import annotations

import ast
import hashlib
import textwrap

from vllm_gdn_invariant.patches.base import SourceTarget


class SourceNotFound(LookupError):
    """The module text has no function of that qualified name."""


def function_source(module_source: str, qualname: str) -> str:
    """The normalized source text of ``qualname`` inside ``module_source``."""
    tree = ast.parse(module_source)
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.name == part
            ),
            None,
        )
        if node is None:
            raise SourceNotFound(qualname)
        body = node.body  # type: ignore[attr-defined]
    segment = ast.get_source_segment(module_source, node, padded=True)
    if segment is None:
        raise SourceNotFound(qualname)
    lines = textwrap.dedent(segment).splitlines()
    return "\n".join(line.rstrip() for line in lines) + "\n"


def fingerprint(module_source: str, qualname: str) -> str:
    text = function_source(module_source, qualname)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_installed_source(target: SourceTarget) -> str | None:
    """The text of the installed module file of ``target``; None when it cannot be read."""
    path = target.installed_source_file()
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def fingerprint_or_none(module_source: str | None, qualname: str) -> str | None:
    """Fingerprint of ``qualname`` in ``module_source``; None when it is not there."""
    if module_source is None:
        return None
    try:
        return fingerprint(module_source, qualname)
    except (SyntaxError, SourceNotFound):
        return None
