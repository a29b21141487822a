"""The plugin's import path holds no evidence code: ``gdn_evidence`` (harness/ and e2e/, outside
the wheel: tests/test_wheel.py) is for the evidence scripts and tests, never loaded by a
serving process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PLUGIN_PATH = (
    "vllm_gdn_invariant.plugin.entry",
    "vllm_gdn_invariant.patches",
    "vllm_gdn_invariant.shadow.checker",
    "vllm_gdn_invariant.kernels",
    "vllm_gdn_invariant.golden",
)
EVIDENCE = ("gdn_evidence",)
ROOT = Path(__file__).resolve().parents[2]  # the checkout: where gdn_evidence is found


def loaded_after_importing(modules: tuple[str, ...]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_serving_modules_load_no_evidence_module():
    loaded = loaded_after_importing(PLUGIN_PATH)
    assert "vllm_gdn_invariant.shadow.checker" in loaded  # the import ran
    assert [m for m in loaded if m.startswith(EVIDENCE)] == []


def test_the_check_sees_an_evidence_import():
    loaded = loaded_after_importing(("gdn_evidence.harness.shadow_case",))
    assert [m for m in loaded if m.startswith(EVIDENCE)]  # so the test above can fail
