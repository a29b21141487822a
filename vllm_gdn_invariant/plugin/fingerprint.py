"""Source fingerprints of vLLM functions.

A fingerprint is the first 16 hex digits of the SHA-256 of a function's source text, as
written in its module file: from ``def`` to its last line, dedented, trailing whitespace
removed. Decorators are not part of it. The same function computes it from an installed
module and from a file read out of a wheel, so both sides agree by construction.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import textwrap

from vllm_gdn_invariant.patches.base import SourceTarget


class SourceNotFound(LookupError):
    """The module text has no function of that qualified name."""


# The line ends ``ast`` counts lines by (str.splitlines also splits on \f, \v, \x1c-\x1e, \x85,
# \u2028 and \u2029, which can stand inside a string literal of a source line).
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|$)")


@functools.lru_cache(maxsize=8)
def _parsed(module_source: str) -> tuple[ast.Module, list[str]]:
    """The module's tree and its lines (with their ends) as ``ast`` numbers them; kept for
    the next targets of the same module (the guard checks several functions per module)."""
    return ast.parse(module_source), _LINE.findall(module_source)


def _segment(lines: list[str], node: ast.AST) -> str:
    """``ast.get_source_segment(source, node, padded=True)`` on lines split once (it splits
    the whole module again on each call)."""
    first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
    start, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    if first == last:
        return lines[first].encode()[start:end].decode()
    head = lines[first].encode()
    padding = "".join(c if c in "\f\t" else " " for c in head[:start].decode())
    tail = lines[last].encode()[:end].decode()
    return padding + head[start:].decode() + "".join(lines[first + 1 : last]) + tail


def function_source(module_source: str, qualname: str) -> str:
    """The normalized source text of ``qualname`` inside ``module_source``."""
    tree, lines = _parsed(module_source)
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
    lines = textwrap.dedent(_segment(lines, node)).splitlines()
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
