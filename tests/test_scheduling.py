"""tests/scheduling.py's work units (pytest-xdist installed: the `test` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("xdist")

from .scheduling import SHARED_SETUP, scope_of  # noqa: E402 - needs pytest-xdist

ROOT = Path(__file__).resolve().parents[1]


def test_tests_that_share_a_setup_run_in_one_work_unit_and_the_rest_alone():
    engine, shadow = "tests/engine/test_serve.py::test_a", "tests/shadow/test_serve.py::t[b]"
    assert scope_of(engine) == scope_of(shadow)
    assert scope_of("tests/cli/test_doctor.py::t1") == scope_of("tests/cli/test_doctor.py::t2")
    assert scope_of("tests/golden/test_x.py::t1") != scope_of("tests/golden/test_x.py::t2")


def test_every_module_of_a_shared_setup_exists():
    assert [path for path in SHARED_SETUP if not (ROOT / path).is_file()] == []
