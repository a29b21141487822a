"""vllm-diffs/vllm-<version>/*.patch: equal to the plugin's change, and applicable as shipped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_gdn_invariant.patches.diffs import (
    MODULE_PATH,
    PATCH_FILE_NAME,
    UPSTREAM_NAME,
    method_block,
    patched_source,
    unified_diff,
)
from vllm_gdn_invariant.plugin.fingerprint import fingerprint
from vllm_gdn_invariant.plugin.versions import FINGERPRINTS, FORWARD_CORE, SUPPORTED_VERSIONS

# a version's first test downloads its wheel (~300 MB) when the cache lacks it
pytestmark = [pytest.mark.wheels, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
DIFFS_FOLDER = "vllm-diffs"


def patch_file(version: str) -> Path:
    return ROOT / DIFFS_FOLDER / f"vllm-{version}" / PATCH_FILE_NAME


def test_there_is_one_patch_per_supported_version():
    shipped = sorted(p.parent.name for p in (ROOT / DIFFS_FOLDER).glob(f"*/{PATCH_FILE_NAME}"))
    assert shipped == [f"vllm-{v}" for v in SUPPORTED_VERSIONS]


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_committed_patch_equals_the_plugins_change(version, wheel_source):
    pristine = wheel_source(version, MODULE_PATH)
    assert patch_file(version).read_text(encoding="utf-8") == unified_diff(pristine), (
        "vllm-diffs/ is stale: run python scripts/make_patches.py"
    )


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_patch_applies_to_the_pristine_file_and_keeps_upstream_intact(
    version, wheel_source, tmp_path
):
    if shutil.which("patch") is None:
        pytest.fail("GNU patch is needed to check the shipped patch files")
    pristine = wheel_source(version, MODULE_PATH)
    target = tmp_path / MODULE_PATH
    target.parent.mkdir(parents=True)
    target.write_text(pristine, encoding="utf-8")
    with open(patch_file(version), "rb") as diff:
        subprocess.run(
            ["patch", "-p1", "--forward", "--quiet"], stdin=diff, cwd=tmp_path, check=True
        )
    patched = target.read_text(encoding="utf-8")
    assert patched == patched_source(pristine)
    compile(patched, str(target), "exec")
    # vLLM's method survives byte for byte under its new name ...
    upstream = fingerprint(
        patched.replace(f"def {UPSTREAM_NAME}(", "def _forward_core_renamed_back(", 1)
        .replace("def _forward_core(", "def _forward_core_routed(", 1)
        .replace("def _forward_core_renamed_back(", "def _forward_core(", 1),
        FORWARD_CORE.qualname,
    )
    assert upstream == FINGERPRINTS[("vllm", version)][FORWARD_CORE.key]
    # ... and the new _forward_core is the plugin's routed method.
    assert method_block() in patched
