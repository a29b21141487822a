"""How pytest-xdist's workers share the tests out (``pytest -n 2``, README's test command).

Tests go to whichever worker is free, one at a time, except those that share an expensive
setup: every test of a module in :data:`SHARED_SETUP` runs in the worker that runs the first
of its group, so a session or module fixture that starts processes runs once. The order is
the collection's (``conftest.py`` puts engine and release tests first).

pytest-xdist's own ``--dist loadgroup`` does not group under pytest 9.2 (its worker renames
``item._nodeid``, which pytest 9.2's nodes no longer read): pytest-xdist issue #1386, PR #1388
open. This scheduler can go once a pytest-xdist release groups again.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

# module -> group: the modules of one group share a fixture that starts processes
SHARED_SETUP = {
    "tests/engine/test_serve.py": "served pair",  # conftest.served: two vllm serve processes
    "tests/shadow/test_serve.py": "served pair",
    "tests/batch_invariance/test_engine_cpu.py": "e2e engine runs",  # report: two engines
    "tests/plugin/test_register.py": "register interpreters",  # runs: fresh interpreters
    "tests/cli/test_doctor.py": "doctor runs",  # runs: doctor subprocesses
    "tests/plugin/test_import_layers.py": "import interpreter",  # loaded: one interpreter
}


def scope_of(nodeid: str) -> str:
    """The work unit of a test: its module's group, or the test alone."""
    return SHARED_SETUP.get(nodeid.split("::", 1)[0], nodeid)


class SharedSetupScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with :func:`scope_of` as the scope, in collection
    order (largest-scope-first reordering off)."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)
