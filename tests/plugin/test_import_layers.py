"""The package's layers: the plugin's import path holds no evidence code (``gdn_evidence``,
harness/ and e2e/, outside the wheel: tests/test_wheel.py, is for the evidence scripts and
tests, never loaded by a serving process); shadow/ and patches/ import nothing from plugin/,
which imports from shadow/ only the setting it parses; the plugin, doctor and the patch index
import without vLLM."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_gdn_invariant

PLUGIN_PATH = (
    "vllm_gdn_invariant.plugin.entry",
    "vllm_gdn_invariant.patches",
    "vllm_gdn_invariant.shadow.checker",
    "vllm_gdn_invariant.kernels",
    "vllm_gdn_invariant.golden",
)
EVIDENCE = ("gdn_evidence",)
ROOT = Path(__file__).resolve().parents[2]  # the checkout: where gdn_evidence is found


def loaded_after_each_import(*groups: tuple[str, ...]) -> list[list[str]]:
    """``sys.modules`` of one fresh interpreter after importing each group of modules in turn."""
    code = (
        "import importlib, json, sys\n"
        f"for group in {[list(g) for g in groups]!r}:\n"
        "    for name in group: importlib.import_module(name)\n"
        "    print('MODULES ' + json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    found = [line for line in out.stdout.splitlines() if line.startswith("MODULES ")]
    assert len(found) == len(groups), out.stdout + out.stderr
    return [json.loads(line[len("MODULES ") :]) for line in found]


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    """The modules loaded after the plugin's import path, then after an evidence module too
    (one interpreter: vLLM is imported once)."""
    serving, evidence = loaded_after_each_import(PLUGIN_PATH, ("gdn_evidence.harness.shadow_case",))
    return {"serving": serving, "evidence": evidence}


def test_serving_modules_load_no_evidence_module(loaded):
    assert "vllm_gdn_invariant.shadow.checker" in loaded["serving"]  # the import ran
    assert [m for m in loaded["serving"] if m.startswith(EVIDENCE)] == []


def test_the_check_sees_an_evidence_import(loaded):
    assert [m for m in loaded["evidence"] if m.startswith(EVIDENCE)]  # so the test above can fail


PACKAGE = Path(vllm_gdn_invariant.__file__).parent


def imported_modules(folder: str) -> dict[str, set[str]]:
    """Every ``vllm_gdn_invariant`` module each file of ``folder`` imports, at any depth of
    the file (function bodies included)."""
    found = {}
    for path in sorted((PACKAGE / folder).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[path.name] = {n for n in names if n.startswith("vllm_gdn_invariant.")}
    return found


def reaching(folder: str, into: str) -> dict[str, list[str]]:
    prefix = f"vllm_gdn_invariant.{into}"
    return {
        name: sorted(m for m in modules if m == prefix or m.startswith(prefix + "."))
        for name, modules in imported_modules(folder).items()
        if any(m == prefix or m.startswith(prefix + ".") for m in modules)
    }


def test_shadow_and_patches_import_nothing_from_plugin():
    assert reaching("shadow", "plugin") == {}
    assert reaching("patches", "plugin") == {}


def test_plugin_imports_from_shadow_only_the_setting_it_parses():
    assert reaching("plugin", "shadow") == {"config.py": ["vllm_gdn_invariant.shadow.config"]}


def test_the_layer_check_sees_an_import_inside_a_function():
    assert reaching("patches", "shadow")  # shadow_hooks.py, imported by the shadow patch


NO_VLLM = """
import importlib.abc, sys
class NoVllm(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError(f"no {name} here")
sys.meta_path.insert(0, NoVllm())
import vllm_gdn_invariant.cli.doctor, vllm_gdn_invariant.plugin.entry
from vllm_gdn_invariant.patches import INDEX, every_patch
every_patch()
print("OK", sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm.")))
"""


def test_the_plugin_doctor_and_the_patch_index_import_without_vllm():
    out = subprocess.run([sys.executable, "-c", NO_VLLM], capture_output=True, text=True)
    assert out.stdout.strip() == "OK []", out.stdout + out.stderr
