"""The installed entry point, and vLLM's own plugin loader calling it (or not): once in a
fresh interpreter with the real ``register``, and for each ``VLLM_PLUGINS`` value here."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import vllm.plugins

from vllm_gdn_invariant.plugin import entry

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

LOADER_PROBE = """
import json
from vllm.plugins import load_general_plugins
from vllm_gdn_invariant.plugin import entry
load_general_plugins()
status = entry.registered_status()
print("RESULT " + json.dumps({"called": status is not None,
                              "applied": bool(status and status.applied)}))
"""


def test_entry_point_is_installed_in_vllms_group():
    (ep,) = [
        ep
        for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
        if ep.name == "gdn_invariant"
    ]
    assert ep.value == "vllm_gdn_invariant.plugin.entry:register"
    assert ep.load() is entry.register


def test_vllms_loader_calls_the_real_register_in_a_fresh_interpreter():
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    env["VLLM_PLUGINS"] = "gdn_invariant"
    proc = subprocess.run(
        [sys.executable, "-c", LOADER_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result == {"called": True, "applied": True}


@pytest.mark.parametrize(
    "plugins, called", [("gdn_invariant", True), ("other", False), ("other,gdn_invariant", True)]
)
def test_vllms_loader_calls_register_only_when_named(monkeypatch, plugins, called):
    """vLLM's loader in this process, with its once-per-process flag cleared; it resolves the
    entry point to ``entry.register``, here a recorder."""
    calls = []
    monkeypatch.setattr(entry, "register", lambda: calls.append(plugins))
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.setenv("VLLM_PLUGINS", plugins)
    vllm.plugins.load_general_plugins()
    assert calls == ([plugins] if called else [])
    assert vllm.plugins.plugins_loaded
