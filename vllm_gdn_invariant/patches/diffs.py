"""The routing change as a source edit of vLLM's ``qwen_gdn_linear_attn.py``.

:func:`patched_source` turns a pristine module text into the patched one: vLLM's
``_forward_core`` is renamed ``_forward_core_upstream``, the plugin's
:func:`~vllm_gdn_invariant.patches.routed_forward_core.routed_forward_core` is inserted
before it as the new ``_forward_core``, and the helpers it calls are inserted before the
class. The inserted text is the plugin's own source, so the diffs under ``vllm-diffs/`` and the
plugin are one change.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap

from vllm_gdn_invariant.patches import routed_forward_core
from vllm_gdn_invariant.patches.routing import FORWARD_CORE, QWEN_GDN_CLASS, UPSTREAM_NAME

MODULE_PATH = FORWARD_CORE.path_in_package
PATCH_FILE_NAME = "qwen_gdn_linear_attn.patch"

# Module-level statements of routed_forward_core.py copied into vLLM's module, in this order.
HELPERS = (
    "GDN_INVARIANT_PAD_SLOT_ID",
    "GDN_INVARIANT_SPLITS",
    "gdn_invariant_drop_programs",
    "gdn_invariant_rebase_conv_programs",
    "gdn_invariant_rebase_checkpoint",
    "gdn_invariant_rebase_flashinfer_plan",
    "gdn_invariant_build_split",
    "gdn_invariant_split_mixed_step",
    "gdn_invariant_routes",
)
# Standard-library imports the copied code needs, added at the top of vLLM's module.
IMPORTS = ("import dataclasses\n", "import weakref\n")
BANNER = "# vllm-gdn-invariant: route mixed-step decode rows through the decode-only kernels."


def _statement_sources(module_source: str, names: tuple[str, ...]) -> list[str]:
    tree = ast.parse(module_source)
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        else:
            continue
        if name in names:
            found[name] = ast.get_source_segment(module_source, node) or ""
    missing = [n for n in names if not found.get(n)]
    if missing:
        raise LookupError(f"routed_forward_core.py lacks {missing}")
    return [found[n] for n in names]


def helper_block() -> str:
    sources = _statement_sources(inspect.getsource(routed_forward_core), HELPERS)
    constants = [s for s in sources if not s.startswith("def ")]
    functions = [s for s in sources if s.startswith("def ")]
    return "\n".join([BANNER, *constants, "", "", "\n\n\n".join(functions), "", ""]) + "\n"


def method_block() -> str:
    source = inspect.getsource(routed_forward_core.routed_forward_core)
    source = source.replace("def routed_forward_core(", "def _forward_core(", 1)
    return textwrap.indent(source, "    ") + "\n"


def patched_source(pristine: str) -> str:
    """The module text with the routing change applied."""
    lines = pristine.splitlines(keepends=True)
    tree = ast.parse(pristine)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == QWEN_GDN_CLASS)
    method = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_forward_core"
    )
    def_line = method.lineno - 1
    if "def _forward_core(" not in lines[def_line]:
        raise LookupError("_forward_core's def line not found")
    lines[def_line] = lines[def_line].replace("def _forward_core(", f"def {UPSTREAM_NAME}(", 1)
    lines.insert(def_line, method_block())
    class_start = min([cls.lineno, *(d.lineno for d in cls.decorator_list)]) - 1
    lines.insert(class_start, helper_block())
    import_line = next(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
    for statement in reversed(IMPORTS):
        lines.insert(import_line, statement)
    return "".join(lines)


def unified_diff(pristine: str) -> str:
    """``patch -p1`` diff from the pristine module to :func:`patched_source`."""
    return "".join(
        difflib.unified_diff(
            pristine.splitlines(keepends=True),
            patched_source(pristine).splitlines(keepends=True),
            fromfile=f"a/{MODULE_PATH}",
            tofile=f"b/{MODULE_PATH}",
        )
    )
