"""Inside a release run: the interpreter runs that release's code, and the plugin patches it.

Skipped outside a release run (``test_releases.py`` starts those).
"""

from __future__ import annotations

import os

import pytest
import vllm

from vllm_gdn_invariant.plugin import entry
from vllm_gdn_invariant.plugin.versions import installed_vllm

RELEASE = os.environ.get("GDN_INVARIANT_RELEASE")
pytestmark = pytest.mark.skipif(RELEASE is None, reason="only inside a release run")


def test_the_interpreter_runs_the_release_under_test():
    installed = installed_vllm()
    assert (installed.distribution, installed.version) == ("vllm", RELEASE)
    assert f"vllm-{RELEASE}" in vllm.__file__


def test_the_plugin_checks_and_patches_the_release_in_strict_mode(monkeypatch):
    monkeypatch.setenv("VLLM_GDN_INVARIANT_STRICT", "1")
    status = entry.plan()
    assert status.refusal is None and status.platform.is_cpu
    assert {c.state.value for c in status.guard.checks} <= {"match", "not in this version"}
