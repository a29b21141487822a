"""CI's test tools: scripts/install_cpu.sh installs pytest, pytest-timeout, pytest-xdist and
ruff at the exact versions of pyproject.toml's ``test`` extra, pytest runs every test under a
time limit (pytest-timeout's ``timeout``), and .ci/run runs README's test command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PINNED = ("pytest", "pytest-timeout", "pytest-xdist", "ruff")


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def exact_pins(requirements: list[str]) -> dict[str, str]:
    """name -> version of each ``name==version`` requirement."""
    pins = {}
    for text in requirements:
        requirement = Requirement(text)
        (spec,) = requirement.specifier or [None]
        if spec is not None and spec.operator == "==":
            pins[requirement.name] = spec.version
    return pins


def install_script_pins(script: str) -> dict[str, str]:
    """The ``name==version`` arguments of the script's pip installs (lines joined at ``\\``)."""
    joined = script.replace("\\\n", " ")
    return dict(re.findall(r"(?<=\s)([A-Za-z0-9_.-]+)==([^\s]+)", joined))


def test_the_install_script_pins_the_test_tools_of_the_test_extra():
    extra = exact_pins(pyproject()["project"]["optional-dependencies"]["test"])
    script = install_script_pins((ROOT / "scripts" / "install_cpu.sh").read_text())
    assert set(PINNED) <= set(extra), extra
    assert {name: script.get(name) for name in PINNED} == {name: extra[name] for name in PINNED}


def test_the_pin_reader_sees_a_version_that_differs():
    """The comparison above can fail: a script pinning another ruff reads differently."""
    script = install_script_pins("pip install -q pytest==9.2.0 \\\n    ruff==0.1.0 requests\n")
    assert script == {"pytest": "9.2.0", "ruff": "0.1.0"}
    assert exact_pins(["ruff>=0.6", "pytest==9.2.0"]) == {"pytest": "9.2.0"}


def test_every_test_runs_under_a_default_time_limit():
    options = pyproject()["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 600


def readme_test_command() -> str:
    """The command in the code block after README's "The second runs the tests:"."""
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("The second runs the tests:") :]
    return re.search(r"```\n(.+?)\n```", after, re.S).group(1).strip()


def test_ci_runs_the_readmes_test_command():
    command = readme_test_command()
    assert command.startswith(".venv/bin/python -m pytest")
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_suite_loads_without_pytest_xdist():
    """The GPU machine's pytest has no pytest-xdist: conftest's scheduler hook is optional."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "tests/test_ci_config.py::test_the_pin_reader_sees_a_version_that_differs"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_ci_lints_and_checks_the_format():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ".venv/bin/ruff check ." in lines
    assert ".venv/bin/ruff format --check ." in lines
