"""Every checker a test makes with helpers.make_checker is closed after it: no thread or exit
finalizer outlives the test."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def close_checkers():
    yield
    helpers = sys.modules.get(f"{__package__}.helpers")  # imported only by the tests using it
    if helpers is not None:
        helpers.close_made()
