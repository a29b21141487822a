"""A function's source text, as fingerprinted, is what ``ast.get_source_segment`` (padded)
gives for its node, dedented, trailing whitespace removed: on line ends ``ast`` counts
(``\\r\\n``, ``\\r``), characters ``str.splitlines`` would split at inside a string literal,
tabs and multibyte characters before a method's name, one-line functions."""

from __future__ import annotations

import ast
import textwrap

import pytest

from vllm_gdn_invariant.plugin.fingerprint import SourceNotFound, fingerprint, function_source

MODULE = (
    'NOTE = "a\u2028b\x0cc\x85d"  # splitlines() would see four lines here\n'
    "\n"
    "class Outer:\r\n"
    "\tdef method(self, x):\r\n"
    "\t\tif x:  \r\n"
    '\t\t\treturn "\u00e9\u00e9"\r\n'
    "\t\treturn x\r\n"
    "\n"
    "    # a comment between\n"
    "def one_line(): return 1\n"
    "def after(a,\r"
    "          b):\r"
    "    return a + b\n"
    "class Nested:\n"
    "    class Inner:\n"
    "        async def step(self):\n"
    '            return "\u2029"\n'
)
QUALNAMES = ["Outer", "Outer.method", "one_line", "after", "Nested.Inner.step", "Nested"]


def reference(module_source: str, qualname: str) -> str:
    """The definition through ``ast.get_source_segment``."""
    body = ast.parse(module_source).body
    for part in qualname.split("."):
        node = next(n for n in body if getattr(n, "name", None) == part)
        body = node.body
    segment = ast.get_source_segment(module_source, node, padded=True)
    lines = textwrap.dedent(segment).splitlines()
    return "\n".join(line.rstrip() for line in lines) + "\n"


@pytest.mark.parametrize("qualname", QUALNAMES)
def test_function_source_is_the_padded_source_segment_of_its_node(qualname):
    assert function_source(MODULE, qualname) == reference(MODULE, qualname)


def test_the_module_fixture_tells_ast_line_numbers_from_splitlines():
    """Lines split with str.splitlines would be misnumbered after the first line: the test
    above could fail on that implementation."""
    node = ast.parse(MODULE).body[1]
    assert MODULE.splitlines(keepends=True)[node.lineno - 1] != "class Outer:\r\n"


def test_each_function_has_its_own_fingerprint_and_an_absent_one_is_refused():
    prints = {name: fingerprint(MODULE, name) for name in QUALNAMES}
    assert len(set(prints.values())) == len(QUALNAMES)
    with pytest.raises(SourceNotFound):
        function_source(MODULE, "Outer.missing")
