"""The wheel holds the runtime package and nothing of the evidence code, the scripts or the
tests: ``pip wheel --no-deps .`` on a copy of this checkout, read back."""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "vllm_gdn_invariant"
LEFT_OUT = ("gdn_evidence", "tests", "scripts", "harness", "e2e")
IGNORED = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".device*")


def setuptools_version() -> Version | None:
    try:
        return Version(importlib.metadata.version("setuptools"))
    except importlib.metadata.PackageNotFoundError:
        return None


# pip builds the wheel in the first test (its own limit: 300 s)
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> dict[str, bytes]:
    """The wheel's members (name: bytes), built without build isolation (no index needed) from
    a copy of the checkout (a build/ folder of an earlier build can leave stale files in a
    wheel)."""
    found = setuptools_version()
    if found is None or found < Version("77"):
        pytest.skip(f"building the wheel needs setuptools>=77 here (found {found})")
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*IGNORED))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + [str(tree), "-w", str(tmp / "out")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = (tmp / "out").glob("*.whl")
    with zipfile.ZipFile(built) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


@pytest.fixture(scope="module")
def wheel_names(wheel) -> list[str]:
    return list(wheel)


def test_the_wheel_holds_the_runtime_package_and_its_metadata_only(wheel_names):
    tops = {name.split("/")[0] for name in wheel_names}
    (info,) = [top for top in tops if top.endswith(".dist-info")]
    assert tops == {PACKAGE, info}
    modules = {name for name in wheel_names if name.endswith(".py")}
    tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*.py")}
    assert modules == tree  # every runtime module, no other


def test_no_evidence_test_or_script_code_is_in_the_wheel(wheel_names):
    parts = {part for name in wheel_names for part in name.split("/")[:-1]}
    assert parts.isdisjoint(LEFT_OUT), sorted(parts & set(LEFT_OUT))


LICENSE_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"  # apache.org


def test_the_checkout_has_the_apache_2_license_text():
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == LICENSE_SHA256  # LICENSE-2.0.txt, unchanged


def test_the_license_file_is_in_the_wheel_and_named_in_its_metadata(wheel):
    (license_path,) = [name for name in wheel if name.endswith(".dist-info/licenses/LICENSE")]
    assert wheel[license_path] == (ROOT / "LICENSE").read_bytes()
    assert [name for name in wheel if ".dist-info/licenses/" in name] == [license_path]
    (metadata,) = [name for name in wheel if name.endswith(".dist-info/METADATA")]
    headers = wheel[metadata].decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
